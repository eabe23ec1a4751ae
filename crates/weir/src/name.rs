//! Queue and reader names: 1 to 100 bytes of `[A-Za-z0-9_:-]`.
//!
//! Names become file and directory names, so the check is strict: anything else is
//! refused before it gets near a path. The rule is `weir-types`' (every backend and
//! front door checks with it); these give its refusal as the engine's [`Error`].

use crate::error::{Error, Result};

pub use weir_types::NAME_LENGTH_MAX;

/// Checks a queue name.
pub fn validate_queue_name(name: &str) -> Result<()> {
    weir_types::validate_queue_name(name).map_err(Error::from)
}

/// Checks a reader name; the default reader has the empty name.
pub fn validate_reader_name(name: &str) -> Result<()> {
    weir_types::validate_reader_name(name).map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_refused_name_is_the_engines_invalid_name() {
        assert!(validate_queue_name("db_bench-0:x").is_ok());
        assert!(validate_reader_name("").is_ok());
        let e = validate_queue_name("a/b").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName);
        assert_eq!(
            e.to_string(),
            "invalid name \"a/b\": only A-Z a-z 0-9 _ : - are allowed"
        );
        assert_eq!(
            validate_reader_name(&"r".repeat(101)).unwrap_err().kind(),
            ErrorKind::InvalidName
        );
    }
}
