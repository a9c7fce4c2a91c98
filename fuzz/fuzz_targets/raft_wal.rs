//! The Raft log's segment files as a member reads them at start (`raft::wal`): any bytes
//! as a segment, through the record decoder and through opening a real log directory
//! holding them (which drops a torn tail and zeroes it), then reading back and decoding
//! every entry it holds.
//!
//! Input: the segment's bytes, taken as they are when they start with the segment magic,
//! else with the magic put in front (so most inputs reach the records). Checked: nothing
//! panics; each record the scan returns re-encodes to exactly the bytes it was read from,
//! and records follow each other without gaps; opening the log either refuses with a
//! typed error or holds entries that read back; a second open finds nothing more to drop.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use openraft::Entry;
use waymark_agent::authority::raft::TypeConfig;
use waymark_agent::authority::raft::codec;
use waymark_agent::authority::raft::wal::{self, SEGMENT_MAGIC, Wal};
use waymark_fuzz::capped;

/// One scratch directory per fuzzing process, emptied for each input.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("waymark-fuzz-wal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let data = capped(data);
    let bytes = if data.starts_with(&SEGMENT_MAGIC) {
        data.to_vec()
    } else {
        [&SEGMENT_MAGIC[..], data].concat()
    };
    let _ = wal::scan_segment(data);
    let Some(scan) = wal::scan_segment(&bytes) else {
        unreachable!("the bytes start with the magic");
    };
    let mut at = SEGMENT_MAGIC.len() as u64;
    for (offset, record) in &scan.records {
        assert_eq!(*offset, at, "records follow each other");
        let mut again = Vec::new();
        wal::encode_record(record, &mut again);
        let start = usize::try_from(*offset).unwrap();
        assert_eq!(&bytes[start..start + again.len()], again.as_slice());
        at += again.len() as u64;
        if record.kind == wal::Kind::Entry {
            let _ = codec::decode::<Entry<TypeConfig>>(record.payload);
        }
    }
    assert_eq!(scan.end, at);
    assert!(scan.end <= bytes.len() as u64);

    // The same bytes as the only segment of a real log directory.
    let dir = scratch();
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    // Named by its first entry, as the log names its segments (else any entry is a gap).
    let name = scan
        .records
        .iter()
        .find(|(_, r)| r.kind == wal::Kind::Entry)
        .map_or(1, |(_, r)| r.log_id.index);
    std::fs::write(dir.join(format!("{name:016x}.wal")), &bytes).unwrap();
    let Ok((log, opened)) = Wal::open(dir, None) else {
        return;
    };
    if let (Some(first), Some(last)) = (log.first(), log.last()) {
        assert_eq!(opened.last, Some(last));
        let entries = log.read(first.index, last.index, usize::MAX).unwrap();
        assert_eq!(entries.len() as u64, last.index - first.index + 1);
    }
    drop(log);
    let (log, again) = Wal::open(dir, None).unwrap();
    assert_eq!(again.torn_bytes, 0, "the first open zeroed the tail");
    assert_eq!(again.last, opened.last);
    drop(log);
});
