//! Tube names to weir queue names and back.
//!
//! beanstalkd allows `A-Za-z0-9-+/;.$_()` in a tube name (at most 200 bytes); a weir
//! queue name is at most 100 bytes of `A-Za-z0-9_:-`. Letters, digits, `-` and `_`
//! stay as they are; each other character becomes `:` and a letter:
//!
//! | tube | `+` | `/` | `;` | `.` | `$` | `(` | `)` |
//! |------|-----|-----|-----|-----|-----|-----|-----|
//! | queue | `:p` | `:s` | `:c` | `:d` | `:u` | `:o` | `:e` |
//!
//! so `jobs.email` is the queue `jobs:demail`. The mapping is one to one: a queue
//! name that is not the image of a tube name (a `:` not followed by one of those
//! letters, as in a memcache queue `a:b`) is no tube, and `list-tubes` leaves it out.
//! A tube whose queue name would be longer than 100 bytes, or would fall among the
//! names weir reserves (`lane:`, `bus:`, `proxy:capture:`), is refused: `BAD_FORMAT`.

const ESCAPES: [(u8, u8); 7] = [
    (b'+', b'p'),
    (b'/', b's'),
    (b';', b'c'),
    (b'.', b'd'),
    (b'$', b'u'),
    (b'(', b'o'),
    (b')', b'e'),
];

/// The weir queue holding the tube `tube` (a name the parser accepted), or `None`
/// when it does not fit weir's names.
pub fn queue_of(tube: &str) -> Option<String> {
    let mut queue = String::with_capacity(tube.len());
    for b in tube.bytes() {
        match ESCAPES.iter().find(|(from, _)| *from == b) {
            Some(&(_, letter)) => {
                queue.push(':');
                queue.push(char::from(letter));
            }
            None => queue.push(char::from(b)),
        }
    }
    let fits =
        weir_backend::validate_queue_name(&queue).is_ok() && !weir_backend::is_reserved(&queue);
    fits.then_some(queue)
}

/// The tube whose queue is `queue`, or `None` when `queue` is no tube's.
pub fn tube_of(queue: &str) -> Option<String> {
    let mut tube = String::with_capacity(queue.len());
    let mut bytes = queue.bytes();
    while let Some(b) = bytes.next() {
        if b != b':' {
            tube.push(char::from(b));
            continue;
        }
        let letter = bytes.next()?;
        let &(from, _) = ESCAPES.iter().find(|(_, l)| *l == letter)?;
        tube.push(char::from(from));
    }
    let valid =
        !tube.is_empty() && !tube.starts_with('-') && queue_of(&tube).as_deref() == Some(queue);
    valid.then_some(tube)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every tube name the parser accepts maps to a valid weir queue name or is
        /// refused, and maps back to itself; no two tubes share a queue.
        #[test]
        fn the_mapping_is_one_to_one(
            name in "[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,80}",
            other in "[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,80}",
        ) {
            if let Some(queue) = queue_of(&name) {
                prop_assert!(weir_backend::validate_queue_name(&queue).is_ok());
                prop_assert_eq!(tube_of(&queue), Some(name.clone()));
                if name != other {
                    prop_assert_ne!(queue_of(&other), Some(queue));
                }
            }
        }
    }

    #[test]
    fn names_map_both_ways() {
        assert_eq!(queue_of("default").as_deref(), Some("default"));
        assert_eq!(queue_of("jobs.email").as_deref(), Some("jobs:demail"));
        assert_eq!(queue_of("a+/;.$()b").as_deref(), Some("a:p:s:c:d:u:o:eb"));
        assert_eq!(tube_of("a:p:s:c:d:u:o:eb").as_deref(), Some("a+/;.$()b"));
        assert_eq!(tube_of("a:b"), None);
        assert_eq!(tube_of("a:"), None);
        assert_eq!(tube_of("lane:x:p3"), None);
        assert_eq!(queue_of(&"x".repeat(100)).map(|q| q.len()), Some(100));
        assert_eq!(queue_of(&"x".repeat(101)), None);
        assert_eq!(queue_of(&".".repeat(51)), None);
        assert_eq!(queue_of("lane.x"), None);
        assert_eq!(queue_of("bus.x"), None);
        assert_eq!(queue_of("lane").as_deref(), Some("lane"));
    }
}
