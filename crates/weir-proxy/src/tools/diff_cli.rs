//! `weir diff report`: what the proxy's diffing shadows found, fetched from a running
//! weir's HTTP port (`GET /proxy/diffs`, which wants the admin key) and printed as
//! text (or as the JSON itself with `--json`). The figures live in the running
//! proxy's memory, so there is no `--data-dir` form.

use anyhow::Context;

use super::capture_cli::{runtime, Location, Reach};
use super::server_client::ServerClient;

#[derive(clap::Subcommand)]
pub enum DiffCommand {
    /// Print what each diffing shadow's comparisons found: outcomes, the fields that
    /// differed with their counts and latest sample, the noise learned.
    Report(ReportArgs),
}

#[derive(clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub at: Location,
    /// Print the JSON weir sent rather than text
    #[arg(long)]
    pub json: bool,
}

pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let Reach::Server { url, key } = args.at.reach()? else {
        anyhow::bail!("the diff figures live in the running proxy: use --server URL");
    };
    let endpoint = format!("{}/proxy/diffs", url.trim_end_matches('/'));
    let text = runtime()?.block_on(async {
        ServerClient::new(&key)?
            .get(&endpoint)
            .await
            .with_context(|| format!("asking {endpoint}"))?
            .text()
            .await
            .with_context(|| format!("reading {endpoint}"))
    })?;
    if args.json {
        println!("{text}");
        return Ok(());
    }
    let report: Vec<crate::RouteReport> =
        serde_json::from_str(&text).with_context(|| format!("{endpoint} sent no diff report"))?;
    print!("{}", crate::diff_report_text(&report));
    Ok(())
}
