//! `version`: `VERSION weir-X.Y.Z`.

use bytes::BufMut;

use super::{Ctx, Flow};

pub fn execute(ctx: &mut Ctx<'_>) -> Flow {
    ctx.out.put_slice(b"VERSION weir-");
    ctx.out.put_slice(env!("CARGO_PKG_VERSION").as_bytes());
    ctx.out.put_slice(b"\r\n");
    Flow::Continue
}
