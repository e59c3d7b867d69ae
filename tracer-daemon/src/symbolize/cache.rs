//! A bounded cache that forgets the least recently used entries,
//! approximately and in O(1).
use std::collections::HashMap;

/// A bounded map that forgets the least recently used entries, approximately and
/// in O(1): entries live in the current generation; when it is full it becomes the
/// previous one (dropping the old previous), and a hit in the previous generation
/// moves the entry back to the current one. Holds at most `2 * (capacity / 2)`.
pub(super) struct GenerationalCache<K, V> {
    generation_capacity: usize,
    current: HashMap<K, V>,
    previous: HashMap<K, V>,
}

impl<K: std::hash::Hash + Eq, V: Clone> GenerationalCache<K, V> {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            generation_capacity: (capacity / 2).max(1),
            current: HashMap::new(),
            previous: HashMap::new(),
        }
    }

    pub(super) fn get(&mut self, key: &K) -> Option<V> {
        if let Some(value) = self.current.get(key) {
            return Some(value.clone());
        }
        let (key, value) = self.previous.remove_entry(key)?;
        self.insert(key, value.clone());
        Some(value)
    }

    pub(super) fn insert(&mut self, key: K, value: V) {
        if self.current.len() >= self.generation_capacity && !self.current.contains_key(&key) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, value);
    }

    pub(super) fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generational_cache_keeps_recent_and_bounds_size() {
        let mut cache = GenerationalCache::new(4);
        cache.insert(1, "a");
        cache.insert(2, "b");
        assert_eq!(cache.len(), 2);
        // Current is full: 3 starts a new generation, 1 and 2 become previous.
        cache.insert(3, "c");
        assert_eq!(cache.get(&1), Some("a")); // promoted: 3 and 1 current
        cache.insert(4, "d"); // rotates: previous = {3, 1}, 2 is forgotten
        assert_eq!(cache.get(&2), None);
        assert_eq!(cache.get(&3), Some("c"));
        assert_eq!(cache.get(&4), Some("d"));
        assert!(cache.len() <= 4);
        // Overwriting a present key never rotates.
        let mut cache = GenerationalCache::new(2);
        cache.insert(1, "a");
        cache.insert(1, "b");
        assert_eq!(cache.get(&1), Some("b"));
        assert_eq!(cache.len(), 1);
    }
}
