//! Every reply of the beanstalkd protocol, spelled once.
//!
//! The fixed replies are constants, byte for byte as beanstalkd 1.12 writes them
//! (`prot.c`, `MSG_*`); the replies that carry a number, a tube name or a body have a
//! small writer each that appends the whole reply to an output buffer. Writers format
//! numbers on the stack: nothing here allocates beyond growing the buffer it is given.

// Errors any command may get.
/// The server could not allocate what the request needed.
pub const OUT_OF_MEMORY: &[u8] = b"OUT_OF_MEMORY\r\n";
/// A bug in the server.
pub const INTERNAL_ERROR: &[u8] = b"INTERNAL_ERROR\r\n";
/// A line not well formed: bad numbers, arguments missing or extra, a bad tube name,
/// a line too long.
pub const BAD_FORMAT: &[u8] = b"BAD_FORMAT\r\n";
/// A command the server does not know.
pub const UNKNOWN_COMMAND: &[u8] = b"UNKNOWN_COMMAND\r\n";

// `put`.
/// A job body not followed by `\r\n` where its byte count says it ends.
pub const EXPECTED_CRLF: &[u8] = b"EXPECTED_CRLF\r\n";
/// A job body larger than the job size limit (the body is read and dropped).
pub const JOB_TOO_BIG: &[u8] = b"JOB_TOO_BIG\r\n";
/// The server is draining: it takes no new jobs.
pub const DRAINING: &[u8] = b"DRAINING\r\n";

// `reserve`, `reserve-with-timeout`.
/// A job reserved by this connection is about to reach its time to run.
pub const DEADLINE_SOON: &[u8] = b"DEADLINE_SOON\r\n";
/// `reserve-with-timeout` found no job in time.
pub const TIMED_OUT: &[u8] = b"TIMED_OUT\r\n";

// Job and tube commands.
/// No such job (or not in a state the command needs), or no such tube.
pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
pub const DELETED: &[u8] = b"DELETED\r\n";
pub const RELEASED: &[u8] = b"RELEASED\r\n";
/// `bury` succeeded, or `release` could not requeue the job and buried it.
pub const BURIED: &[u8] = b"BURIED\r\n";
pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
/// `ignore` of the only tube watched.
pub const NOT_IGNORED: &[u8] = b"NOT_IGNORED\r\n";
/// `kick-job` succeeded (`kick` answers [`kicked_count`]).
pub const KICKED: &[u8] = b"KICKED\r\n";
pub const PAUSED: &[u8] = b"PAUSED\r\n";

/// `INSERTED <id>\r\n`: `put` stored the job.
pub fn inserted(out: &mut Vec<u8>, id: u64) {
    word_number(out, b"INSERTED ", id);
}

/// `BURIED <id>\r\n`: `put` stored the job but had to bury it.
pub fn buried_id(out: &mut Vec<u8>, id: u64) {
    word_number(out, b"BURIED ", id);
}

/// `USING <tube>\r\n`: `use` and `list-tube-used`.
pub fn using(out: &mut Vec<u8>, tube: &str) {
    out.extend_from_slice(b"USING ");
    out.extend_from_slice(tube.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `WATCHING <count>\r\n`: `watch` and `ignore`.
pub fn watching(out: &mut Vec<u8>, count: u64) {
    word_number(out, b"WATCHING ", count);
}

/// `KICKED <count>\r\n`: `kick`.
pub fn kicked_count(out: &mut Vec<u8>, count: u64) {
    word_number(out, b"KICKED ", count);
}

/// `RESERVED <id> <bytes>\r\n<data>\r\n`: a reserve command's job.
pub fn reserved(out: &mut Vec<u8>, id: u64, data: &[u8]) {
    job(out, b"RESERVED ", id, data);
}

/// `FOUND <id> <bytes>\r\n<data>\r\n`: a peek command's job.
pub fn found(out: &mut Vec<u8>, id: u64, data: &[u8]) {
    job(out, b"FOUND ", id, data);
}

/// `OK <bytes>\r\n<yaml>\r\n`: the stats and list commands, `yaml` being the YAML
/// document (`---\n` and its lines, each ending in `\n`).
pub fn ok(out: &mut Vec<u8>, yaml: &[u8]) {
    out.extend_from_slice(b"OK ");
    decimal(out, yaml.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(yaml);
    out.extend_from_slice(b"\r\n");
}

/// The YAML list `list-tubes` and `list-tubes-watched` send inside [`ok`]:
/// `---\n` then `- <name>\n` per tube.
pub fn tube_list<'t>(out: &mut Vec<u8>, tubes: impl IntoIterator<Item = &'t str>) {
    out.extend_from_slice(b"---\n");
    for tube in tubes {
        out.extend_from_slice(b"- ");
        out.extend_from_slice(tube.as_bytes());
        out.push(b'\n');
    }
}

/// `<word><id> <bytes>\r\n<data>\r\n`.
fn job(out: &mut Vec<u8>, word: &[u8], id: u64, data: &[u8]) {
    out.extend_from_slice(word);
    decimal(out, id);
    out.push(b' ');
    decimal(out, data.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// `<word><number>\r\n`.
fn word_number(out: &mut Vec<u8>, word: &[u8], number: u64) {
    out.extend_from_slice(word);
    decimal(out, number);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in decimal.
fn decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        write(&mut out);
        out
    }

    #[test]
    fn numbered_replies_are_spelled_as_beanstalkd_spells_them() {
        assert_eq!(written(|o| inserted(o, 0)), b"INSERTED 0\r\n");
        assert_eq!(
            written(|o| inserted(o, u64::MAX)),
            b"INSERTED 18446744073709551615\r\n"
        );
        assert_eq!(written(|o| buried_id(o, 7)), b"BURIED 7\r\n");
        assert_eq!(written(|o| watching(o, 2)), b"WATCHING 2\r\n");
        assert_eq!(written(|o| kicked_count(o, 10)), b"KICKED 10\r\n");
        assert_eq!(written(|o| using(o, "default")), b"USING default\r\n");
    }

    #[test]
    fn job_replies_carry_the_body_and_its_length() {
        assert_eq!(
            written(|o| reserved(o, 12, b"a\r\nb")),
            b"RESERVED 12 4\r\na\r\nb\r\n"
        );
        assert_eq!(written(|o| found(o, 1, b"")), b"FOUND 1 0\r\n\r\n");
    }

    #[test]
    fn ok_counts_the_yaml_without_its_trailing_crlf() {
        let mut yaml = Vec::new();
        tube_list(&mut yaml, ["default", "a"]);
        assert_eq!(yaml, b"---\n- default\n- a\n");
        assert_eq!(
            written(|o| ok(o, &yaml)),
            b"OK 18\r\n---\n- default\n- a\n\r\n"
        );
    }
}
