//! One shared `Arc<str>` per distinct file name (or function, module) across
//! every snapshot read from a file, so that comparing two snapshots loaded
//! separately compares names by address, as snapshots of one process do.
//!
//! The table holds weak references only: a name no snapshot uses any more
//! is forgotten at the next purge (when the table has doubled since the
//! last one), so memory stays bounded by the names in use.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

struct Names {
    map: HashMap<Box<str>, Weak<str>>,
    /// Size after the last purge.
    purged_at: usize,
}

static NAMES: Mutex<Option<Names>> = Mutex::new(None);

/// The shared `Arc<str>` holding `text`.
pub(crate) fn intern(text: &str) -> Arc<str> {
    let mut guard = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let names = guard.get_or_insert_with(|| Names {
        map: HashMap::new(),
        purged_at: 0,
    });
    if let Some(shared) = names.map.get(text).and_then(Weak::upgrade) {
        return shared;
    }
    if names.map.len() >= 1024 && names.map.len() >= 2 * names.purged_at {
        names.map.retain(|_, weak| weak.strong_count() > 0);
        names.purged_at = names.map.len();
    }
    let shared: Arc<str> = Arc::from(text);
    names.map.insert(Box::from(text), Arc::downgrade(&shared));
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_share_one_arc_while_used() {
        let a = intern("tests/intern/a.c");
        let b = intern("tests/intern/a.c");
        assert!(Arc::ptr_eq(&a, &b));
        let c = intern("tests/intern/c.c");
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
