//! The objects the pickle machine makes: scalars inline, containers in
//! arenas, and instances of the two tracemalloc classes as records of the
//! state `BUILD` gave them (no class is ever called).

use std::sync::Arc;

use super::PickleError;
use crate::codec::chunked::{Chunked, Slab, SlabRef};

/// The two classes a tracemalloc snapshot pickle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Snapshot,
    Traces,
}

impl Class {
    pub(super) fn name(self) -> &'static str {
        match self {
            Class::Snapshot => "tracemalloc.Snapshot",
            Class::Traces => "tracemalloc._Traces",
        }
    }
}

/// A value on the pickle machine's stack: scalars inline, containers as
/// indices into the parser's arenas (so values are `Copy`, 16 bytes, and
/// a memo reference costs nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An int above `i64::MAX` that fits in 64 bits (a size may be one).
    UInt(u64),
    /// An int that fits in neither but in 128 bits: its index in
    /// [`Heap::wide`] (kept for the error that names it).
    Wide(u32),
    /// An int that does not fit in 128 bits.
    BigInt,
    Str(u32),
    Tuple(u32),
    List(u32),
    Dict(u32),
    Class(Class),
    Object(u32),
}

impl Value {
    /// The value of the int `v` if it fits in 64 bits (signed or not).
    pub(super) fn int(v: i128) -> Option<Self> {
        if let Ok(v) = i64::try_from(v) {
            Some(Value::Int(v))
        } else {
            u64::try_from(v).ok().map(Value::UInt)
        }
    }

    pub(super) fn kind(self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::UInt(_) | Value::Wide(_) | Value::BigInt => "int",
            Value::Str(_) => "str",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Class(_) => "class",
            Value::Object(_) => "object",
        }
    }
}

/// An instance made by `NEWOBJ`: its class and the state `BUILD` gave it.
pub(super) struct Object {
    pub(super) class: Class,
    pub(super) state: Option<Value>,
}

/// The parser's arenas, all [`Chunked`] (or a [`Slab`]): what a file
/// makes them hold costs its length, as charged, never a doubling's copy.
#[derive(Default)]
pub(super) struct Heap {
    pub(super) strings: Chunked<Arc<str>>,
    /// Tuples are immutable: each one's items lie whole in the slab.
    pub(super) tuples: Chunked<SlabRef>,
    pub(super) tuple_items: Slab<Value>,
    pub(super) lists: Chunked<Chunked<Value>>,
    pub(super) dicts: Chunked<Chunked<(Value, Value)>>,
    pub(super) objects: Chunked<Object>,
    /// Ints of 65 to 128 bits.
    pub(super) wide: Chunked<i128>,
}

impl Heap {
    pub(super) fn tuple(&self, index: u32) -> &[Value] {
        match self.tuples.get(index as usize) {
            Some(&at) => self.tuple_items.slice(at),
            None => &[],
        }
    }

    /// The int `value` holds, if it is one of at most 128 bits.
    pub(super) fn int(&self, value: Value) -> Option<i128> {
        match value {
            Value::Int(v) => Some(i128::from(v)),
            Value::UInt(v) => Some(i128::from(v)),
            Value::Wide(i) => self.wide.get(i as usize).copied(),
            _ => None,
        }
    }

    pub(super) fn str(&self, index: u32) -> Option<&Arc<str>> {
        self.strings.get(index as usize)
    }

    pub(super) fn dict_get(&self, dict: u32, key: &str) -> Option<Value> {
        self.dicts
            .get(dict as usize)?
            .iter()
            .rev()
            .find_map(|&(k, v)| match k {
                Value::Str(s) if self.str(s).is_some_and(|s| &**s == key) => Some(v),
                _ => None,
            })
    }
}

pub(super) fn arena_index(len: usize, offset: usize) -> Result<u32, PickleError> {
    u32::try_from(len).map_err(|_| PickleError::Malformed {
        offset,
        reason: "too many objects".into(),
    })
}
