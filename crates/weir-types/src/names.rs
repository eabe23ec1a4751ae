//! Queue and reader names: 1 to [`NAME_LENGTH_MAX`] bytes of `[A-Za-z0-9_:-]`, the
//! default reader's name empty.
//!
//! Names become file and directory names on the embedded engine and subject tokens
//! on JetStream, so the check is strict: anything else is refused before it gets near
//! a path or a subject. Every front door and both backends check with these.

use std::fmt;

/// Longest accepted name, in bytes.
pub const NAME_LENGTH_MAX: usize = 100;

/// A name refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidName {
    /// The name (its first [`NAME_LENGTH_MAX`] + 10 characters).
    pub name: String,
    pub reason: &'static str,
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid name {:?}: {}", self.name, self.reason)
    }
}

impl std::error::Error for InvalidName {}

/// Checks a queue name.
pub fn validate_queue_name(name: &str) -> Result<(), InvalidName> {
    validate(name, false)
}

/// Checks a reader name; the default reader has the empty name.
pub fn validate_reader_name(name: &str) -> Result<(), InvalidName> {
    validate(name, true)
}

fn validate(name: &str, empty_ok: bool) -> Result<(), InvalidName> {
    let bad = |reason| {
        Err(InvalidName {
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

    #[test]
    fn the_refusal_names_the_name_and_why() {
        let e = validate_queue_name("a b").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid name \"a b\": only A-Z a-z 0-9 _ : - are allowed"
        );
        let long = "x".repeat(500);
        assert_eq!(
            validate_queue_name(&long).unwrap_err().name.len(),
            NAME_LENGTH_MAX + 10
        );
    }
}
