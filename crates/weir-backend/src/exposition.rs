//! The one encoder of `/metrics`: every series of every door (the memcache door,
//! the bus, the proxy), the queues' and readers' figures and the backend's own are
//! written by the `prometheus-client` crate's Prometheus text encoder (format
//! 0.0.4), so escaping, the `# HELP`/`# TYPE` lines and histogram buckets are done in
//! one place.
//!
//! The figures are read from live state at scrape time (atomics the request paths
//! bump, the backend's queue figures gathered for the scrape): each part of the
//! page encodes them through a [`DescriptorEncoder`], the way a `prometheus-client`
//! [`Collector`] does, rather than mirroring them into registry metrics. The helpers
//! here take a counter's name as it is exposed (with its `_total`): the encoder adds
//! that suffix itself, so they hand it the name without.

use std::fmt;

pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
pub use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{EncodeLabelSet, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The Prometheus text (0.0.4) of what `collector` encodes.
pub fn text(collector: impl Collector) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut out = String::new();
    // Writing into a `String` does not fail, and the parts of the page return no
    // error of their own: an error here would be a bug, logged, with an empty page.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        tracing::warn!(error = %e, "/metrics: encoding failed");
    }
    out
}

/// The name the encoder is given for a counter exposed as `name`: without the
/// `_total` it appends.
fn counter_stem(name: &str) -> &str {
    debug_assert!(
        name.ends_with("_total"),
        "counter {name} must end in _total"
    );
    name.strip_suffix("_total").unwrap_or(name)
}

/// A counter without labels.
pub fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    enc.encode_descriptor(counter_stem(name), help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, u64, u64>(&v, None)
}

/// A gauge without labels.
pub fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    enc.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

/// A family of counters: one sample per `(labels, value)` (the `# HELP` and `# TYPE`
/// lines even when there is none).
pub fn counters<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut family = enc.encode_descriptor(counter_stem(name), help, None, MetricType::Counter)?;
    for (labels, v) in samples {
        family
            .encode_family(&labels)?
            .encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
    }
    Ok(())
}

/// A family of gauges, as [`counters`].
pub fn gauges<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        family.encode_family(&labels)?.encode_gauge(&v)?;
    }
    Ok(())
}

/// A histogram family: `each` is called once with the family's encoder, and
/// encodes its samples (`MetricEncoder::encode_family`, then
/// `MetricEncoder::encode_histogram` or a `prometheus-client` histogram's
/// `EncodeMetric::encode`).
pub fn histograms(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    each: impl FnOnce(&mut MetricEncoder<'_>) -> fmt::Result,
) -> fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    each(&mut family)
}

/// A histogram's buckets as the encoder takes them, from `bounds` and the count of
/// each bucket alone (not cumulative; the encoder sums them): `(upper bound, count)`.
pub fn buckets(bounds: &[f64], counts: impl IntoIterator<Item = u64>) -> Vec<(f64, u64)> {
    bounds.iter().copied().zip(counts).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Sample;

    impl Collector for Sample {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            counter(&mut enc, "t_done_total", "Done.", 3)?;
            gauges(&mut enc, "t_rows", "Rows.", [([("name", "a\"b\\c\nd")], 1)])?;
            histograms(&mut enc, "t_seconds", "Time.", |h| {
                let b = buckets(&[0.5, 1.0], [1, 2]);
                h.encode_histogram::<NoLabelSet>(2.5, 4, &b, None)
            })
        }
    }

    #[test]
    fn one_encoder_writes_the_text_format() {
        let page = text(Sample);
        let expected = "# HELP t_done_total Done.\n# TYPE t_done_total counter\nt_done_total 3\n\
             # HELP t_rows Rows.\n# TYPE t_rows gauge\nt_rows{name=\"a\\\"b\\\\c\\nd\"} 1\n\
             # HELP t_seconds Time.\n# TYPE t_seconds histogram\n\
             t_seconds_bucket{le=\"0.5\"} 1\nt_seconds_bucket{le=\"1\"} 3\n\
             t_seconds_bucket{le=\"+Inf\"} 4\nt_seconds_sum 2.5\nt_seconds_count 4\n";
        assert_eq!(page, expected);
    }
}
