//! The command words of the beanstalkd protocol and how a line's command is found.
//!
//! beanstalkd 1.12 does not split the line into words: it compares the start of the
//! line with each command's spelling, in a fixed order, and takes the first that
//! matches (`which_cmd` in `prot.c`). Commands with arguments are spelled with their
//! space (`"delete "`), commands without are not (`"stats"`), and the order puts the
//! longer spellings first where one begins another. weir finds commands the same way,
//! so it answers the same reply to the same odd line: `statsx` and `reserve-job` (no
//! space) are a known command with a bad line (`BAD_FORMAT`), `peek` alone is not a
//! command at all (`UNKNOWN_COMMAND`), `quitter` is `quit`. Words are case-sensitive.

/// A command of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Put,
    Peek,
    PeekReady,
    PeekDelayed,
    PeekBuried,
    ReserveWithTimeout,
    ReserveJob,
    Reserve,
    Delete,
    Release,
    Bury,
    Kick,
    KickJob,
    Touch,
    StatsJob,
    StatsTube,
    Stats,
    Use,
    Watch,
    Ignore,
    ListTubesWatched,
    ListTubeUsed,
    ListTubes,
    Quit,
    PauseTube,
}

/// Each command's spelling as matched at the start of a line, in beanstalkd's order.
const SPELLINGS: [(&[u8], Command); 25] = [
    (b"put ", Command::Put),
    (b"peek ", Command::Peek),
    (b"peek-ready", Command::PeekReady),
    (b"peek-delayed", Command::PeekDelayed),
    (b"peek-buried", Command::PeekBuried),
    (b"reserve-with-timeout ", Command::ReserveWithTimeout),
    (b"reserve-job ", Command::ReserveJob),
    (b"reserve", Command::Reserve),
    (b"delete ", Command::Delete),
    (b"release ", Command::Release),
    (b"bury ", Command::Bury),
    (b"kick ", Command::Kick),
    (b"kick-job ", Command::KickJob),
    (b"touch ", Command::Touch),
    (b"stats-job ", Command::StatsJob),
    (b"stats-tube ", Command::StatsTube),
    (b"stats", Command::Stats),
    (b"use ", Command::Use),
    (b"watch ", Command::Watch),
    (b"ignore ", Command::Ignore),
    (b"list-tubes-watched", Command::ListTubesWatched),
    (b"list-tube-used", Command::ListTubeUsed),
    (b"list-tubes", Command::ListTubes),
    (b"quit", Command::Quit),
    (b"pause-tube", Command::PauseTube),
];

impl Command {
    /// Every command, in the order beanstalkd tries them.
    pub fn all() -> impl Iterator<Item = Command> {
        SPELLINGS.iter().map(|&(_, command)| command)
    }

    /// The command found at the start of `line` (without its `\r\n`) and the rest of
    /// the line after its spelling, or `None`: `UNKNOWN_COMMAND`.
    pub fn find(line: &[u8]) -> Option<(Command, &[u8])> {
        SPELLINGS
            .iter()
            .find(|(spelling, _)| line.starts_with(spelling))
            .map(|&(spelling, command)| (command, &line[spelling.len()..]))
    }

    /// The command's name as a client writes it (`put`, `peek-ready`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Command::Put => "put",
            Command::Peek => "peek",
            Command::PeekReady => "peek-ready",
            Command::PeekDelayed => "peek-delayed",
            Command::PeekBuried => "peek-buried",
            Command::ReserveWithTimeout => "reserve-with-timeout",
            Command::ReserveJob => "reserve-job",
            Command::Reserve => "reserve",
            Command::Delete => "delete",
            Command::Release => "release",
            Command::Bury => "bury",
            Command::Kick => "kick",
            Command::KickJob => "kick-job",
            Command::Touch => "touch",
            Command::StatsJob => "stats-job",
            Command::StatsTube => "stats-tube",
            Command::Stats => "stats",
            Command::Use => "use",
            Command::Watch => "watch",
            Command::Ignore => "ignore",
            Command::ListTubesWatched => "list-tubes-watched",
            Command::ListTubeUsed => "list-tube-used",
            Command::ListTubes => "list-tubes",
            Command::Quit => "quit",
            Command::PauseTube => "pause-tube",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_spellings_win_where_one_begins_another() {
        let found = |line: &[u8]| Command::find(line).map(|(c, rest)| (c, rest.to_vec()));
        assert_eq!(found(b"reserve"), Some((Command::Reserve, vec![])));
        assert_eq!(
            found(b"reserve-with-timeout 5"),
            Some((Command::ReserveWithTimeout, b"5".to_vec()))
        );
        // Without its space, `reserve-job` is `reserve` with junk after it.
        assert_eq!(
            found(b"reserve-job"),
            Some((Command::Reserve, b"-job".to_vec()))
        );
        assert_eq!(
            found(b"stats-tube x"),
            Some((Command::StatsTube, b"x".to_vec()))
        );
        assert_eq!(
            found(b"stats-job"),
            Some((Command::Stats, b"-job".to_vec()))
        );
        assert_eq!(
            found(b"list-tubes-watched"),
            Some((Command::ListTubesWatched, vec![]))
        );
        assert_eq!(found(b"peek"), None);
        assert_eq!(found(b"PUT 1 2 3 4"), None);
    }

    #[test]
    fn every_command_has_one_spelling_and_its_name_starts_it() {
        for command in Command::all() {
            let spelling = SPELLINGS
                .iter()
                .find(|(_, c)| *c == command)
                .map(|(s, _)| *s);
            assert!(spelling.is_some_and(|s| s.starts_with(command.name().as_bytes())));
        }
        assert_eq!(Command::all().count(), 25);
    }
}
