//! Queue and reader names: 1 to 100 bytes of `[A-Za-z0-9_:-]`.
//!
//! Names become file and directory names, so the check is strict: anything else is
//! refused before it gets near a path.

use crate::error::{Error, Result};

/// Longest accepted name, in bytes.
pub const NAME_LENGTH_MAX: usize = 100;

/// Checks a queue name.
pub fn validate_queue_name(name: &str) -> Result<()> {
    validate(name, false)
}

/// Checks a reader name; the default reader has the empty name.
pub fn validate_reader_name(name: &str) -> Result<()> {
    validate(name, true)
}

fn validate(name: &str, empty_ok: bool) -> Result<()> {
    let bad = |reason| {
        Err(Error::InvalidName {
            name: name.chars().take(NAME_LENGTH_MAX + 10).collect(),
            reason,
        })
    };
    if name.is_empty() {
        return if empty_ok { Ok(()) } else { bad("empty") };
    }
    if name.len() > NAME_LENGTH_MAX {
        return bad("longer than 100 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':' || b == b'-')
    {
        return bad("only A-Z a-z 0-9 _ : - are allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_refuses() {
        assert!(validate_queue_name("a").is_ok());
        assert!(validate_queue_name("db_bench-0:x").is_ok());
        assert!(validate_queue_name(&"a".repeat(100)).is_ok());
        assert!(validate_queue_name(&"a".repeat(101)).is_err());
        assert!(validate_queue_name("").is_err());
        assert!(validate_reader_name("").is_ok());
        for bad in ["../x", "a/b", "a.b", "a b", "é", "a\0", "."] {
            assert!(validate_queue_name(bad).is_err(), "{bad:?}");
        }
    }
}
