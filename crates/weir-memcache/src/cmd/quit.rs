//! `quit`: close the connection once the replies before it are written.

use super::ctx::{Ctx, Flow};

pub fn execute(_ctx: &mut Ctx<'_>) -> Flow {
    Flow::Close
}
