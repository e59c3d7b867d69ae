//! ELF files a traced process maps (any file: the bytes are the traced
//! program's choice): the unwinder's table compiler refuses them or
//! compiles them, never panics, and every table it returns has its shape:
//! each page's rows start at `pc` 0 and rise strictly, and the walker's
//! lookup finds a row at every page's start.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_daemon::elf::unwind::{MAX_FILE_ROWS, compile, row_at};

fuzz_target!(|data: &[u8]| {
    let Ok(table) = compile(data) else { return };
    assert!(table.rows() <= MAX_FILE_ROWS);
    for (&page, rows) in &table.pages {
        assert_eq!(rows.first().map(|row| row.pc), Some(0));
        assert!(rows.windows(2).all(|pair| pair[0].pc < pair[1].pc));
        assert_eq!(row_at(&table, u64::from(page) << 16), rows[0]);
    }
});
