//! `quit`: close the connection once the replies before it are written.

use super::{Ctx, Flow};

pub fn execute(_ctx: &mut Ctx<'_>) -> Flow {
    Flow::Close
}
