//! `version`: `VERSION weir-X.Y.Z`.

use super::ctx::{Ctx, Flow};

pub fn execute(ctx: &mut Ctx<'_>) -> Flow {
    ctx.out.put(b"VERSION weir-");
    ctx.out.put(env!("CARGO_PKG_VERSION").as_bytes());
    ctx.out.put(b"\r\n");
    Flow::Continue
}
