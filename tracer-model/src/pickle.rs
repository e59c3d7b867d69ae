//! Python's own tracemalloc dump files: `Snapshot.dump()` writes
//! `pickle.dump(snapshot, f, pickle.HIGHEST_PROTOCOL)`, and
//! `Snapshot.load()` reads it back with `pickle.load`.
//!
//! [`load_tracemalloc`] parses such a file **without executing it**: it is
//! a small interpreter of the pickle opcodes that protocols 2 to 5 use for
//! a `tracemalloc.Snapshot` (ints, strings, tuples, lists, dicts, `None`,
//! booleans, memo, framing, `NEWOBJ` and `BUILD`), in which the only
//! classes that may be named are `tracemalloc.Snapshot` and
//! `tracemalloc._Traces`, and no class is ever called: objects are plain
//! records of their state. Anything else (other globals, `REDUCE`,
//! extension codes, persistent ids, protocol 0/1 text opcodes) is refused
//! with an error naming the opcode and its offset. Memory use is bounded by
//! a small multiple of the input size.
//!
//! [`dump_tracemalloc`] writes a protocol-4 pickle that Python's
//! `tracemalloc.Snapshot.load()` reads into an equal snapshot (file names,
//! line numbers, domains, sizes, `total_nframe`, `traceback_limit`; the
//! extras tracemalloc has no place for are not written).

use std::collections::HashMap;
use std::sync::Arc;

use super::hash::FxHashMap;
use super::snapshot::Snapshot;
use crate::engine::index::FrameHints;
use crate::trace::{Frame, Trace, Traceback};

/// Why a pickle was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// The input is not a pickle this parser reads, or is malformed.
    #[error("not a tracemalloc snapshot pickle: {reason} (at byte {offset})")]
    Malformed {
        /// Byte offset of the opcode.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
    /// The pickle is well formed but does not hold a tracemalloc snapshot
    /// of the expected shape.
    #[error("the pickle does not hold a tracemalloc snapshot: {reason}")]
    Shape {
        /// What is wrong, with the path of the value.
        reason: String,
    },
}

fn shape(reason: impl Into<String>) -> PickleError {
    PickleError::Shape {
        reason: reason.into(),
    }
}

/// The two classes a tracemalloc snapshot pickle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Snapshot,
    Traces,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Snapshot => "tracemalloc.Snapshot",
            Class::Traces => "tracemalloc._Traces",
        }
    }
}

/// A value on the pickle machine's stack: scalars inline, containers as
/// indices into the parser's arenas (so values are `Copy` and a memo
/// reference costs nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    None,
    Bool(bool),
    Int(i128),
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
    fn kind(self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt => "int",
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
struct Object {
    class: Class,
    state: Option<Value>,
}

/// The parser's arenas.
#[derive(Default)]
struct Heap {
    strings: Vec<Arc<str>>,
    /// Tuples are immutable: their items live in one flat vector.
    tuples: Vec<(u32, u32)>,
    tuple_items: Vec<Value>,
    lists: Vec<Vec<Value>>,
    dicts: Vec<Vec<(Value, Value)>>,
    objects: Vec<Object>,
}

impl Heap {
    fn tuple(&self, index: u32) -> &[Value] {
        match self.tuples.get(index as usize) {
            Some(&(start, len)) => self
                .tuple_items
                .get(start as usize..start as usize + len as usize)
                .unwrap_or(&[]),
            None => &[],
        }
    }

    fn str(&self, index: u32) -> Option<&Arc<str>> {
        self.strings.get(index as usize)
    }

    fn dict_get(&self, dict: u32, key: &str) -> Option<Value> {
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

fn arena_index(len: usize, offset: usize) -> Result<u32, PickleError> {
    u32::try_from(len).map_err(|_| PickleError::Malformed {
        offset,
        reason: "too many objects".into(),
    })
}

/// The pickle virtual machine, restricted to data.
struct Machine<'a> {
    input: &'a [u8],
    at: usize,
    /// Offset of the opcode being run, for errors.
    op_at: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Vec<Value>,
    heap: Heap,
    /// Equal strings share one `Arc` (file names repeat a lot).
    interned: HashMap<Arc<str>, u32>,
}

impl<'a> Machine<'a> {
    fn err(&self, reason: impl Into<String>) -> PickleError {
        PickleError::Malformed {
            offset: self.op_at,
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.input.len());
        match end {
            Some(end) => {
                let out = self.input.get(self.at..end).unwrap_or(&[]);
                self.at = end;
                Ok(out)
            }
            None => Err(self.err(format!(
                "the input ends inside an opcode ({n} bytes needed, {} left)",
                self.input.len().saturating_sub(self.at)
            ))),
        }
    }

    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let bytes = self.take(n)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(self.err("pops past a MARK"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.err("the stack is empty"))
    }

    fn top_mut(&mut self) -> Result<&mut Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("the stack is empty"));
        }
        let offset = self.op_at;
        self.stack.last_mut().ok_or(PickleError::Malformed {
            offset,
            reason: "the stack is empty".into(),
        })
    }

    /// Pops everything above the last MARK, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK to pop to"))?;
        if mark > self.stack.len() {
            return Err(self.err("MARK above the stack"));
        }
        Ok(self.stack.split_off(mark))
    }

    fn push(&mut self, value: Value) {
        self.stack.push(value);
    }

    fn string(&mut self, bytes: &[u8]) -> Result<Value, PickleError> {
        // Python writes str with "surrogatepass"; a lone surrogate is not
        // text a frame can hold.
        let text = std::str::from_utf8(bytes)
            .map_err(|e| self.err(format!("a str is not valid UTF-8 ({e})")))?;
        if let Some(&index) = self.interned.get(text) {
            return Ok(Value::Str(index));
        }
        let index = arena_index(self.heap.strings.len(), self.op_at)?;
        let shared: Arc<str> = super::intern::intern(text);
        self.heap.strings.push(Arc::clone(&shared));
        self.interned.insert(shared, index);
        Ok(Value::Str(index))
    }

    fn tuple(&mut self, items: &[Value]) -> Result<Value, PickleError> {
        let index = arena_index(self.heap.tuples.len(), self.op_at)?;
        let start = arena_index(self.heap.tuple_items.len(), self.op_at)?;
        let len = arena_index(items.len(), self.op_at)?;
        self.heap.tuple_items.extend_from_slice(items);
        self.heap.tuples.push((start, len));
        Ok(Value::Tuple(index))
    }

    fn tuple_n(&mut self, n: usize) -> Result<(), PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() < floor + n {
            return Err(self.err(format!("TUPLE{n} needs {n} items on the stack")));
        }
        let items = self.stack.split_off(self.stack.len() - n);
        let tuple = self.tuple(&items)?;
        self.push(tuple);
        Ok(())
    }

    fn global(&mut self, module: &[u8], name: &[u8]) -> Result<Value, PickleError> {
        match (module, name) {
            (b"tracemalloc", b"Snapshot") => Ok(Value::Class(Class::Snapshot)),
            (b"tracemalloc", b"_Traces") => Ok(Value::Class(Class::Traces)),
            _ => Err(self.err(format!(
                "it refers to {}.{}; only tracemalloc.Snapshot and tracemalloc._Traces are accepted (nothing is executed)",
                String::from_utf8_lossy(module),
                String::from_utf8_lossy(name)
            ))),
        }
    }

    fn memo_put(&mut self, index: u64) -> Result<(), PickleError> {
        let value = *self.top_mut()?;
        let index = usize::try_from(index).unwrap_or(usize::MAX);
        if index < self.memo.len() {
            if let Some(slot) = self.memo.get_mut(index) {
                *slot = value;
            }
        } else if index == self.memo.len() {
            self.memo.push(value);
        } else {
            return Err(self.err(format!(
                "memo index {index} skips ahead of {} (Python numbers the memo in order)",
                self.memo.len()
            )));
        }
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<(), PickleError> {
        let value = usize::try_from(index)
            .ok()
            .and_then(|i| self.memo.get(i).copied())
            .ok_or_else(|| self.err(format!("memo index {index} was never stored")))?;
        self.push(value);
        Ok(())
    }

    fn long(&mut self, bytes: &[u8]) -> Value {
        if bytes.is_empty() {
            return Value::Int(0);
        }
        if bytes.len() > 16 {
            return Value::BigInt;
        }
        let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
        let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
        if let Some(dst) = buf.get_mut(..bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        Value::Int(i128::from_le_bytes(buf))
    }

    /// Runs the opcodes up to STOP; returns the value left on the stack.
    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            self.op_at = self.at;
            let op = *self
                .input
                .get(self.at)
                .ok_or_else(|| self.err("the input ends before STOP"))?;
            self.at += 1;
            match op {
                0x80 => {
                    // PROTO
                    let proto = self.le(1)?;
                    if !(2..=5).contains(&proto) {
                        return Err(self.err(format!(
                            "pickle protocol {proto} is not supported (2 to 5 are; Snapshot.dump() writes 5)"
                        )));
                    }
                }
                0x95 => {
                    // FRAME: a length hint only.
                    self.le(8)?;
                }
                b'.' => {
                    // STOP
                    let value = self.pop()?;
                    if !self.marks.is_empty() {
                        return Err(self.err("STOP inside a MARK"));
                    }
                    return Ok(value);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    // POP
                    self.pop()?;
                }
                b'1' => {
                    // POP_MARK
                    self.pop_mark()?;
                }
                b'2' => {
                    // DUP
                    let top = *self.top_mut()?;
                    self.push(top);
                }
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                b'J' => {
                    // BININT: signed 32-bit
                    let v = self.le(4)? as u32 as i32;
                    self.push(Value::Int(i128::from(v)));
                }
                b'K' => {
                    let v = self.le(1)?;
                    self.push(Value::Int(i128::from(v)));
                }
                b'M' => {
                    let v = self.le(2)?;
                    self.push(Value::Int(i128::from(v)));
                }
                0x8a => {
                    // LONG1
                    let n = self.le(1)? as usize;
                    let bytes = self.take(n)?;
                    let v = self.long(bytes);
                    self.push(v);
                }
                0x8b => {
                    // LONG4
                    let n = self.le(4)? as u32 as i32;
                    let n =
                        usize::try_from(n).map_err(|_| self.err("LONG4 with a negative length"))?;
                    let bytes = self.take(n)?;
                    let v = self.long(bytes);
                    self.push(v);
                }
                0x8c => {
                    // SHORT_BINUNICODE
                    let n = self.le(1)? as usize;
                    let bytes = self.take(n)?;
                    let v = self.string(bytes)?;
                    self.push(v);
                }
                b'X' => {
                    // BINUNICODE
                    let n = self.le(4)? as usize;
                    let bytes = self.take(n)?;
                    let v = self.string(bytes)?;
                    self.push(v);
                }
                0x8d => {
                    // BINUNICODE8
                    let n = usize::try_from(self.le(8)?).unwrap_or(usize::MAX);
                    let bytes = self.take(n)?;
                    let v = self.string(bytes)?;
                    self.push(v);
                }
                b')' => {
                    let v = self.tuple(&[])?;
                    self.push(v);
                }
                0x85 => self.tuple_n(1)?,
                0x86 => self.tuple_n(2)?,
                0x87 => self.tuple_n(3)?,
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.tuple(&items)?;
                    self.push(v);
                }
                b']' => {
                    let index = arena_index(self.heap.lists.len(), self.op_at)?;
                    self.heap.lists.push(Vec::new());
                    self.push(Value::List(index));
                }
                b'l' => {
                    // LIST
                    let items = self.pop_mark()?;
                    let index = arena_index(self.heap.lists.len(), self.op_at)?;
                    self.heap.lists.push(items);
                    self.push(Value::List(index));
                }
                b'a' => {
                    // APPEND
                    let item = self.pop()?;
                    let list = *self.top_mut()?;
                    self.list_mut(list)?.push(item);
                }
                b'e' => {
                    // APPENDS
                    let items = self.pop_mark()?;
                    let list = *self.top_mut()?;
                    self.list_mut(list)?.extend(items);
                }
                b'}' => {
                    let index = arena_index(self.heap.dicts.len(), self.op_at)?;
                    self.heap.dicts.push(Vec::new());
                    self.push(Value::Dict(index));
                }
                b'd' => {
                    // DICT
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(&items)?;
                    let index = arena_index(self.heap.dicts.len(), self.op_at)?;
                    self.heap.dicts.push(pairs);
                    self.push(Value::Dict(index));
                }
                b's' => {
                    // SETITEM
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let dict = *self.top_mut()?;
                    self.dict_mut(dict)?.push((key, value));
                }
                b'u' => {
                    // SETITEMS
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(&items)?;
                    let dict = *self.top_mut()?;
                    self.dict_mut(dict)?.extend(pairs);
                }
                b'c' => {
                    // GLOBAL "module\nname\n"
                    let module = self.line()?;
                    let name = self.line()?;
                    let v = self.global(module, name)?;
                    self.push(v);
                }
                0x93 => {
                    // STACK_GLOBAL
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Value::Str(m), Value::Str(n)) = (module, name) else {
                        return Err(self.err("STACK_GLOBAL needs two str"));
                    };
                    let module = self.heap.str(m).cloned().unwrap_or_else(|| Arc::from(""));
                    let name = self.heap.str(n).cloned().unwrap_or_else(|| Arc::from(""));
                    let v = self.global(module.as_bytes(), name.as_bytes())?;
                    self.push(v);
                }
                0x81 => {
                    // NEWOBJ: cls.__new__(cls, *args); only for our classes
                    // and with no arguments, which is what copyreg writes.
                    let args = self.pop()?;
                    let class = self.pop()?;
                    let Value::Class(class) = class else {
                        return Err(self.err(format!("NEWOBJ of a {}", class.kind())));
                    };
                    if !matches!(args, Value::Tuple(t) if self.heap.tuple(t).is_empty()) {
                        return Err(self.err(format!("NEWOBJ of {} with arguments", class.name())));
                    }
                    let index = arena_index(self.heap.objects.len(), self.op_at)?;
                    self.heap.objects.push(Object { class, state: None });
                    self.push(Value::Object(index));
                }
                b'b' => {
                    // BUILD: record the state; nothing is called.
                    let state = self.pop()?;
                    let object = *self.top_mut()?;
                    let Value::Object(index) = object else {
                        return Err(self.err(format!("BUILD on a {}", object.kind())));
                    };
                    let offset = self.op_at;
                    let slot = self.heap.objects.get_mut(index as usize).ok_or(
                        PickleError::Malformed {
                            offset,
                            reason: "BUILD on an unknown object".into(),
                        },
                    )?;
                    if slot.state.is_some() {
                        return Err(self.err("BUILD twice on one object"));
                    }
                    slot.state = Some(state);
                }
                0x94 => {
                    // MEMOIZE
                    let index = self.memo.len() as u64;
                    self.memo_put(index)?;
                }
                b'q' => {
                    let i = self.le(1)?;
                    self.memo_put(i)?;
                }
                b'r' => {
                    let i = self.le(4)?;
                    self.memo_put(i)?;
                }
                b'h' => {
                    let i = self.le(1)?;
                    self.memo_get(i)?;
                }
                b'j' => {
                    let i = self.le(4)?;
                    self.memo_get(i)?;
                }
                other => {
                    return Err(self.err(format!(
                        "opcode {} ({other:#04x}) is not one a tracemalloc snapshot uses",
                        opcode_name(other)
                    )));
                }
            }
        }
    }

    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = self.input.get(self.at..).unwrap_or(&[]);
        let end = rest
            .iter()
            .take(256)
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.err("GLOBAL without a newline"))?;
        let line = rest.get(..end).unwrap_or(&[]);
        self.at += end + 1;
        Ok(line)
    }

    fn pairs(&self, items: &[Value]) -> Result<Vec<(Value, Value)>, PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err("an odd number of items for a dict"));
        }
        Ok(items.chunks_exact(2).map(|p| (p[0], p[1])).collect())
    }

    fn list_mut(&mut self, list: Value) -> Result<&mut Vec<Value>, PickleError> {
        let offset = self.op_at;
        let fail = |kind: &str| PickleError::Malformed {
            offset,
            reason: format!("APPEND to a {kind}"),
        };
        match list {
            Value::List(i) => self
                .heap
                .lists
                .get_mut(i as usize)
                .ok_or_else(|| fail("list")),
            other => Err(fail(other.kind())),
        }
    }

    fn dict_mut(&mut self, dict: Value) -> Result<&mut Vec<(Value, Value)>, PickleError> {
        let offset = self.op_at;
        let fail = |kind: &str| PickleError::Malformed {
            offset,
            reason: format!("SETITEM on a {kind}"),
        };
        match dict {
            Value::Dict(i) => self
                .heap
                .dicts
                .get_mut(i as usize)
                .ok_or_else(|| fail("dict")),
            other => Err(fail(other.kind())),
        }
    }
}

/// pickletools' name of an opcode, for errors.
fn opcode_name(op: u8) -> &'static str {
    match op {
        b'R' => "REDUCE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'i' => "INST",
        b'o' => "OBJ",
        0x82..=0x84 => "EXT",
        0x92 => "NEWOBJ_EX",
        b'I' => "INT",
        b'L' => "LONG",
        b'F' => "FLOAT",
        b'G' => "BINFLOAT",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'B' | b'C' | 0x8e => "BYTES",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        b'p' => "PUT",
        b'g' => "GET",
        _ => "unknown",
    }
}

/// A traceback's shared `Arc` and its index in order of first appearance.
type Interned = (Arc<Traceback>, u32);

/// A traceback tuple's frames, and where their numbers are in the hints.
type FrameList = (Arc<[Frame]>, (usize, usize));

/// Builds the model's snapshot from the parsed values.
struct Converter<'h> {
    heap: &'h Heap,
    names: FxHashMap<u32, Arc<str>>,
    /// Each frame tuple: its frame and number (the index's hint).
    frames: FxHashMap<u32, (Frame, u32)>,
    /// Each traceback tuple: its frames and where their numbers are in
    /// `hints.ids`.
    frame_lists: FxHashMap<u32, FrameList>,
    /// The frame numbers of each distinct `Arc`, for the snapshot's index.
    hints: FrameHints,
    /// Each traceback tuple (with its total_nframe): its `Arc` and interned
    /// index.
    tracebacks: FxHashMap<(u32, Option<u32>), Interned>,
    /// Equal tracebacks from separate tuples share one `Arc` (and index).
    by_content: HashMap<(Arc<Traceback>, Option<u32>), Interned>,
    /// The distinct `Arc`s in order of first appearance.
    interned: Vec<Arc<Traceback>>,
}

/// A converted snapshot, before indexing.
struct Parts {
    traces: Vec<Trace>,
    traceback_limit: u32,
    tracebacks: Vec<Arc<Traceback>>,
    ids: Vec<u32>,
    hints: FrameHints,
}

impl Parts {
    fn into_snapshot(self) -> Snapshot {
        Snapshot::with_interned(
            self.traces,
            self.traceback_limit,
            self.tracebacks,
            self.ids,
            self.hints,
        )
    }
}

/// Where a value is, for error messages (formatted only on error).
#[derive(Clone, Copy)]
struct At {
    trace: usize,
    frame: Option<usize>,
    field: &'static str,
}

impl At {
    fn trace(trace: usize) -> Self {
        At {
            trace,
            frame: None,
            field: "",
        }
    }

    fn frame(self, frame: usize) -> Self {
        At {
            frame: Some(frame),
            ..self
        }
    }

    fn field(self, field: &'static str) -> Self {
        At { field, ..self }
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "trace {}", self.trace)?;
        if let Some(frame) = self.frame {
            write!(f, " frame {frame}")?;
        }
        if !self.field.is_empty() {
            write!(f, " {}", self.field)?;
        }
        Ok(())
    }
}

fn int_in<T: TryFrom<i128>>(
    value: Value,
    what: impl std::fmt::Display,
    range: &str,
) -> Result<T, PickleError> {
    match value {
        Value::Int(v) => T::try_from(v)
            .map_err(|_| shape(format!("{what} {v} is out of range (must be {range})"))),
        Value::BigInt => Err(shape(format!("{what} is out of range (must be {range})"))),
        other => Err(shape(format!("{what} is a {}, not an int", other.kind()))),
    }
}

impl Converter<'_> {
    fn object_state(&self, value: Value, class: Class, what: &str) -> Result<u32, PickleError> {
        let Value::Object(index) = value else {
            return Err(shape(format!(
                "{what} is a {}, not a {}",
                value.kind(),
                class.name()
            )));
        };
        let object = self
            .heap
            .objects
            .get(index as usize)
            .ok_or_else(|| shape(format!("{what} is missing")))?;
        if object.class != class {
            return Err(shape(format!(
                "{what} is a {}, not a {}",
                object.class.name(),
                class.name()
            )));
        }
        match object.state {
            Some(Value::Dict(d)) => Ok(d),
            Some(other) => Err(shape(format!(
                "the state of {what} is a {}, not a dict",
                other.kind()
            ))),
            None => Err(shape(format!("{what} has no state"))),
        }
    }

    fn name(&mut self, value: Value, at: At) -> Result<Arc<str>, PickleError> {
        let Value::Str(index) = value else {
            return Err(shape(format!(
                "{at}: the file name is a {}, not a str",
                value.kind()
            )));
        };
        if let Some(name) = self.names.get(&index) {
            return Ok(Arc::clone(name));
        }
        let name = self
            .heap
            .str(index)
            .cloned()
            .ok_or_else(|| shape(format!("{at}: unknown str")))?;
        self.names.insert(index, Arc::clone(&name));
        Ok(name)
    }

    /// The frame of a `(filename, lineno)` tuple, and its number.
    fn frame(&mut self, value: Value, at: At) -> Result<(Frame, u32), PickleError> {
        let Value::Tuple(index) = value else {
            return Err(shape(format!(
                "{at} is a {}, not a (filename, lineno) tuple",
                value.kind()
            )));
        };
        if let Some((frame, number)) = self.frames.get(&index) {
            return Ok((frame.clone(), *number));
        }
        let &[filename, lineno] = self.heap.tuple(index) else {
            return Err(shape(format!("{at} is not a (filename, lineno) pair")));
        };
        let frame = Frame {
            filename: self.name(filename, at)?,
            lineno: int_in(lineno, at.field("lineno"), "0 to 4294967295")?,
            extra: None,
        };
        let number = u32::try_from(self.frames.len()).unwrap_or(u32::MAX);
        self.frames.insert(index, (frame.clone(), number));
        self.hints.count = self.frames.len();
        Ok((frame, number))
    }

    fn traceback(
        &mut self,
        value: Value,
        total_nframe: Option<u32>,
        at: At,
    ) -> Result<(Arc<Traceback>, u32), PickleError> {
        let Value::Tuple(index) = value else {
            return Err(shape(format!(
                "{at}: the traceback is a {}, not a tuple",
                value.kind()
            )));
        };
        if let Some((tb, id)) = self.tracebacks.get(&(index, total_nframe)) {
            return Ok((Arc::clone(tb), *id));
        }
        let (frames, span) = match self.frame_lists.get(&index) {
            Some((frames, span)) => (Arc::clone(frames), *span),
            None => {
                let items = self.heap.tuple(index);
                if items.is_empty() {
                    return Err(shape(format!(
                        "{at}: the traceback has no frame (tracemalloc records at least one)"
                    )));
                }
                let mut frames = Vec::with_capacity(items.len());
                let start = self.hints.ids.len();
                for (i, &item) in items.iter().enumerate() {
                    let (frame, number) = self.frame(item, at.frame(i))?;
                    frames.push(frame);
                    self.hints.ids.push(number);
                }
                let span = (start, self.hints.ids.len());
                let frames: Arc<[Frame]> = Arc::from(frames);
                self.frame_lists.insert(index, (Arc::clone(&frames), span));
                (frames, span)
            }
        };
        let fresh = Arc::new(Traceback::from_frames(frames, total_nframe));
        let next = u32::try_from(self.interned.len()).unwrap_or(u32::MAX);
        let (traceback, id) = {
            let (traceback, id) = self
                .by_content
                .entry((Arc::clone(&fresh), total_nframe))
                .or_insert_with(|| (fresh, next));
            (Arc::clone(traceback), *id)
        };
        if id == next {
            self.interned.push(Arc::clone(&traceback));
            self.hints.spans.push(span);
        }
        self.tracebacks
            .insert((index, total_nframe), (Arc::clone(&traceback), id));
        Ok((traceback, id))
    }

    fn snapshot(&mut self, root: Value) -> Result<Parts, PickleError> {
        let state = self.object_state(root, Class::Snapshot, "the pickled object")?;
        let limit = self
            .heap
            .dict_get(state, "traceback_limit")
            .ok_or_else(|| shape("Snapshot has no traceback_limit"))?;
        let traceback_limit: u32 = int_in(limit, "traceback_limit", "0 to 4294967295")?;
        let traces = self
            .heap
            .dict_get(state, "traces")
            .ok_or_else(|| shape("Snapshot has no traces"))?;
        let traces_state = self.object_state(traces, Class::Traces, "Snapshot.traces")?;
        let raw = self
            .heap
            .dict_get(traces_state, "_traces")
            .ok_or_else(|| shape("Snapshot.traces has no _traces"))?;
        let items: &[Value] = match raw {
            Value::List(i) => self.heap.lists.get(i as usize).map_or(&[], Vec::as_slice),
            Value::Tuple(i) => self.heap.tuple(i),
            other => {
                return Err(shape(format!(
                    "Snapshot.traces._traces is a {}",
                    other.kind()
                )));
            }
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ids = Vec::with_capacity(items.len());
        for (n, &item) in items.iter().enumerate() {
            let Value::Tuple(t) = item else {
                return Err(shape(format!(
                    "trace {n} is a {}, not a tuple",
                    item.kind()
                )));
            };
            let (domain, size, traceback, total) = match *self.heap.tuple(t) {
                [d, s, tb] => (d, s, tb, Value::None),
                [d, s, tb, total] => (d, s, tb, total),
                _ => {
                    return Err(shape(format!(
                        "trace {n} is not (domain, size, traceback[, total_nframe])"
                    )));
                }
            };
            let at = At::trace(n);
            let total_nframe = match total {
                Value::None => None,
                v => Some(int_in(v, at.field("total_nframe"), "0 to 4294967295")?),
            };
            let (traceback, id) = self.traceback(traceback, total_nframe, at)?;
            out.push(Trace {
                domain: int_in(domain, at.field("domain"), "0 to 4294967295")?,
                size: int_in(size, at.field("size"), "0 to 2**64-1")?,
                traceback,
            });
            ids.push(id);
        }
        Ok(Parts {
            traces: out,
            traceback_limit,
            tracebacks: std::mem::take(&mut self.interned),
            ids,
            hints: std::mem::take(&mut self.hints),
        })
    }
}

/// Parses a file written by Python's `tracemalloc.Snapshot.dump()` (pickle
/// protocol 2 to 5) into a snapshot, without executing anything.
///
/// Equal tracebacks share one `Arc` (whether the pickle memoized them as
/// one tuple or not), as the model's grouping prefers.
///
/// # Errors
/// [`PickleError::Malformed`] for a pickle this parser does not read
/// (naming the opcode and offset); [`PickleError::Shape`] when the values
/// are not a tracemalloc snapshot or do not fit the model (e.g. a size of
/// 2**64 or more, a negative domain, an empty traceback).
pub fn load_tracemalloc(bytes: &[u8]) -> Result<Snapshot, PickleError> {
    if bytes.first() != Some(&0x80) {
        return Err(PickleError::Malformed {
            offset: 0,
            reason: "it does not start with a PROTO opcode (0x80)".into(),
        });
    }
    let mut machine = Machine {
        input: bytes,
        at: 0,
        op_at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        heap: Heap::default(),
        interned: HashMap::new(),
    };
    let root = machine.run()?;
    if machine.at != bytes.len() {
        return Err(PickleError::Malformed {
            offset: machine.at,
            reason: format!("{} bytes after STOP", bytes.len() - machine.at),
        });
    }
    let mut converter = Converter {
        heap: &machine.heap,
        names: FxHashMap::default(),
        frames: FxHashMap::default(),
        frame_lists: FxHashMap::default(),
        tracebacks: FxHashMap::default(),
        by_content: HashMap::new(),
        interned: Vec::new(),
        hints: FrameHints::default(),
    };
    let parts = converter.snapshot(root)?;
    // The parsed values are no longer needed: free them before indexing.
    drop(converter);
    drop(machine);
    Ok(parts.into_snapshot())
}

/// Writes pickle opcodes with a memo numbered in order, as Python does.
struct Writer {
    out: Vec<u8>,
    memo_len: u32,
}

impl Writer {
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo_len += 1;
        self.memo_len - 1
    }

    fn get(&mut self, index: u32) {
        if let Ok(small) = u8::try_from(index) {
            self.out.extend_from_slice(&[b'h', small]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&index.to_le_bytes());
        }
    }

    fn str(&mut self, text: &str) {
        let len = text.len();
        if let Ok(short) = u8::try_from(len) {
            self.out.extend_from_slice(&[0x8c, short]);
        } else if let Ok(long) = u32::try_from(len) {
            self.out.push(b'X');
            self.out.extend_from_slice(&long.to_le_bytes());
        } else {
            self.out.push(0x8d);
            self.out.extend_from_slice(&(len as u64).to_le_bytes());
        }
        self.out.extend_from_slice(text.as_bytes());
    }

    /// Python's `save_long` for protocol 2 and later.
    fn int(&mut self, value: u64) {
        if let Ok(v) = u8::try_from(value) {
            self.out.extend_from_slice(&[b'K', v]);
        } else if let Ok(v) = u16::try_from(value) {
            self.out.push(b'M');
            self.out.extend_from_slice(&v.to_le_bytes());
        } else if value <= 0x7fff_ffff {
            self.out.push(b'J');
            self.out.extend_from_slice(&(value as u32).to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, one more byte than
            // bit_length // 8 so the sign bit is clear.
            let bits = 64 - value.leading_zeros() as usize;
            let n = (bits >> 3) + 1;
            self.out.extend_from_slice(&[0x8a, n as u8]);
            let bytes = u128::from(value).to_le_bytes();
            self.out.extend_from_slice(bytes.get(..n).unwrap_or(&bytes));
        }
    }
}

/// Writes `snapshot` as Python's `Snapshot.dump()` would (protocol 4, which
/// every Python since 3.4 reads): `tracemalloc.Snapshot` with
/// `traces = tracemalloc._Traces([(domain, size, frames, total_nframe),
/// ...])` and `traceback_limit`. Equal strings, frames and tracebacks are
/// written once and referenced through the memo.
#[must_use]
pub fn dump_tracemalloc(snapshot: &Snapshot) -> Vec<u8> {
    let mut w = Writer {
        out: Vec::with_capacity(64 + snapshot.traces.len() * 16),
        memo_len: 0,
    };
    w.out.extend_from_slice(&[0x80, 4]);
    w.str("tracemalloc");
    let module = w.memoize();
    w.str("Snapshot");
    w.memoize();
    w.out.push(0x93);
    w.memoize();
    w.out.extend_from_slice(&[b')', 0x81]);
    w.memoize();
    w.out.push(b'}');
    w.memoize();
    w.out.push(b'(');
    w.str("traces");
    w.memoize();
    w.get(module);
    w.str("_Traces");
    w.memoize();
    w.out.push(0x93);
    w.memoize();
    w.out.extend_from_slice(&[b')', 0x81]);
    w.memoize();
    w.out.push(b'}');
    w.memoize();
    w.str("_traces");
    w.memoize();
    w.out.push(b']');
    w.memoize();

    let mut names: HashMap<&str, u32> = HashMap::new();
    let mut frames: HashMap<(&str, u32), u32> = HashMap::new();
    let mut tracebacks: FxHashMap<*const Traceback, u32> = FxHashMap::default();
    let mut by_content: HashMap<&Traceback, u32> = HashMap::new();
    for batch in snapshot.traces.chunks(1000) {
        w.out.push(b'(');
        for trace in batch {
            w.out.push(b'(');
            w.int(u64::from(trace.domain));
            w.int(trace.size);
            let pointer = Arc::as_ptr(&trace.traceback);
            let traceback: &Traceback = &trace.traceback;
            match tracebacks
                .get(&pointer)
                .or_else(|| by_content.get(traceback))
            {
                Some(&index) => w.get(index),
                None => {
                    let list = traceback.frames();
                    if list.len() > 3 {
                        w.out.push(b'(');
                    }
                    for frame in list {
                        match frames.get(&(&*frame.filename, frame.lineno)) {
                            Some(&index) => w.get(index),
                            None => {
                                match names.get(&*frame.filename) {
                                    Some(&index) => w.get(index),
                                    None => {
                                        w.str(&frame.filename);
                                        let index = w.memoize();
                                        names.insert(&frame.filename, index);
                                    }
                                }
                                w.int(u64::from(frame.lineno));
                                w.out.push(0x86);
                                let index = w.memoize();
                                frames.insert((&frame.filename, frame.lineno), index);
                            }
                        }
                    }
                    match list.len() {
                        1 => w.out.push(0x85),
                        2 => w.out.push(0x86),
                        3 => w.out.push(0x87),
                        _ => w.out.push(b't'),
                    }
                    let index = w.memoize();
                    tracebacks.insert(pointer, index);
                    by_content.insert(traceback, index);
                }
            }
            match trace.traceback.total_nframe() {
                Some(n) => w.int(u64::from(n)),
                None => w.out.push(b'N'),
            }
            w.out.push(b't');
            w.memoize();
        }
        w.out.push(b'e');
    }
    // _Traces.__dict__['_traces'] = list; BUILD
    w.out.extend_from_slice(b"sb");
    w.str("traceback_limit");
    w.memoize();
    w.int(u64::from(snapshot.traceback_limit));
    w.out.extend_from_slice(b"ub.");
    w.out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (STYLE.md).
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// `pickle.dumps(tracemalloc.Snapshot([(1, 100, (("a.c", 3), ("b.c",
    /// 1)), 2), (2, 50, <same>, None), (1, 7, (("<unknown>", 0),), 1), (0,
    /// 2**63, (("é.c", 2**32-1),), 3)], 5), 5)` from Python 3.11.
    const PYTHON: &[u8] = b"\x80\x05\x95\xcc\x00\x00\x00\x00\x00\x00\x00\x8c\x0btracemalloc\x94\x8c\x08Snapshot\x94\x93\x94)\x81\x94}\x94(\x8c\x06traces\x94h\x00\x8c\x07_Traces\x94\x93\x94)\x81\x94}\x94\x8c\x07_traces\x94]\x94((K\x01Kd\x8c\x03a.c\x94K\x03\x86\x94\x8c\x03b.c\x94K\x01\x86\x94\x86\x94K\x02t\x94(K\x02K2h\x10Nt\x94(K\x01K\x07\x8c\x09<unknown>\x94K\x00\x86\x94\x85\x94K\x01t\x94(K\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8c\x04\xc3\xa9.c\x94\x8a\x05\xff\xff\xff\xff\x00\x86\x94\x85\x94K\x03t\x94esb\x8c\x0ftraceback_limit\x94K\x05ub.";

    #[test]
    fn reads_what_python_writes() {
        let snapshot = load_tracemalloc(PYTHON).expect("parses");
        assert_eq!(snapshot.traceback_limit(), 5);
        let traces = snapshot.traces();
        assert_eq!(traces.len(), 4);
        assert_eq!((traces[0].domain, traces[0].size), (1, 100));
        let frames: Vec<String> = traces[0]
            .traceback
            .frames()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            frames,
            ["a.c:3", "b.c:1"],
            "most recent first, as tracemalloc stores them"
        );
        assert_eq!(traces[0].traceback.total_nframe(), Some(2));
        assert_eq!(traces[1].traceback.total_nframe(), None);
        assert_eq!(traces[1].traceback, traces[0].traceback);
        assert_eq!(traces[2].traceback.frames()[0].to_string(), "<unknown>:0");
        assert_eq!(traces[3].size, 1 << 63);
        assert_eq!(
            traces[3].traceback.frames()[0].to_string(),
            "é.c:4294967295"
        );
    }

    #[test]
    fn round_trips_through_our_writer() {
        let snapshot = load_tracemalloc(PYTHON).expect("parses");
        let again = load_tracemalloc(&dump_tracemalloc(&snapshot)).expect("reads our own pickle");
        assert_eq!(again, snapshot);
        let traces = again.traces();
        assert!(Arc::ptr_eq(&traces[0].traceback, &traces[0].traceback));
        assert_eq!(traces[1].traceback.total_nframe(), None);
    }

    #[test]
    fn writes_python_ints_as_save_long_does() {
        let cases: [(u64, &[u8]); 7] = [
            (0, b"K\x00"),
            (255, b"K\xff"),
            (256, b"M\x00\x01"),
            (65_536, b"J\x00\x00\x01\x00"),
            (0x7fff_ffff, b"J\xff\xff\xff\x7f"),
            (0x8000_0000, b"\x8a\x05\x00\x00\x00\x80\x00"),
            (u64::MAX, b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00"),
        ];
        for (value, bytes) in cases {
            let mut w = Writer {
                out: Vec::new(),
                memo_len: 0,
            };
            w.int(value);
            assert_eq!(w.out, bytes, "{value}");
        }
    }

    #[test]
    fn refuses_code_and_foreign_classes_without_running_them() {
        // pickle.dumps(os.system) and a REDUCE of it.
        let global = b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.";
        assert_eq!(
            load_tracemalloc(global).unwrap_err().to_string(),
            "not a tracemalloc snapshot pickle: it refers to posix.system; only tracemalloc.Snapshot and tracemalloc._Traces are accepted (nothing is executed) (at byte 28)"
        );
        let reduce = b"\x80\x02ctracemalloc\nSnapshot\n)R.";
        assert_eq!(
            load_tracemalloc(reduce).unwrap_err().to_string(),
            "not a tracemalloc snapshot pickle: opcode REDUCE (0x52) is not one a tracemalloc snapshot uses (at byte 25)"
        );
        let proto0 = b"(lp0\n.";
        assert!(
            load_tracemalloc(proto0)
                .unwrap_err()
                .to_string()
                .contains("PROTO")
        );
        let list = b"\x80\x04]\x94.";
        assert_eq!(
            load_tracemalloc(list).unwrap_err().to_string(),
            "the pickle does not hold a tracemalloc snapshot: the pickled object is a list, not a tracemalloc.Snapshot"
        );
    }

    #[test]
    fn values_outside_the_model_are_refused() {
        let snapshot = |trace: &[u8]| -> Vec<u8> {
            // Built by hand: Snapshot with one trace tuple given as opcodes.
            let mut out = b"\x80\x04\x8c\x0btracemalloc\x94\x8c\x08Snapshot\x93)\x81}(\x8c\x06traces\x8c\x0btracemalloc\x8c\x07_Traces\x93)\x81}\x8c\x07_traces](".to_vec();
            out.extend_from_slice(trace);
            out.extend_from_slice(b"esb\x8c\x0ftraceback_limitK\x01ub.");
            out
        };
        let ok = snapshot(b"(K\x01K\x02\x8c\x01aK\x03\x86\x85Nt");
        assert_eq!(load_tracemalloc(&ok).expect("valid").traces()[0].size, 2);
        let negative = snapshot(b"(J\xff\xff\xff\xffK\x02\x8c\x01aK\x03\x86\x85Nt");
        assert_eq!(
            load_tracemalloc(&negative).unwrap_err().to_string(),
            "the pickle does not hold a tracemalloc snapshot: trace 0 domain -1 is out of range (must be 0 to 4294967295)"
        );
        let empty = snapshot(b"(K\x01K\x02)Nt");
        assert!(
            load_tracemalloc(&empty)
                .unwrap_err()
                .to_string()
                .contains("has no frame")
        );
        let huge =
            snapshot(b"(K\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8c\x01aK\x03\x86\x85Nt");
        assert!(
            load_tracemalloc(&huge)
                .unwrap_err()
                .to_string()
                .contains("size 18446744073709551616 is out of range")
        );
    }

    #[test]
    fn truncations_and_random_bytes_are_refused_cleanly() {
        for cut in 0..PYTHON.len() {
            assert!(
                load_tracemalloc(&PYTHON[..cut]).is_err(),
                "truncated at {cut} accepted"
            );
        }
        let mut rng = StdRng::seed_from_u64(9);
        let ours = dump_tracemalloc(&load_tracemalloc(PYTHON).expect("parses"));
        for _ in 0..20_000 {
            let mut bytes = match rng.random_range(0..3) {
                0 => PYTHON.to_vec(),
                1 => ours.clone(),
                _ => {
                    let mut b = vec![0x80, rng.random_range(2..6)];
                    b.extend((0..rng.random_range(0..64)).map(|_| rng.random::<u8>()));
                    b
                }
            };
            for _ in 0..rng.random_range(1..4) {
                if bytes.is_empty() {
                    break;
                }
                let at = rng.random_range(0..bytes.len());
                match rng.random_range(0..3) {
                    0 => bytes[at] = rng.random(),
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at, rng.random()),
                }
            }
            let _ = load_tracemalloc(&bytes);
        }
        // A length prefix of 2**63 allocates nothing.
        let bomb = b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x80abc";
        assert!(
            load_tracemalloc(bomb)
                .unwrap_err()
                .to_string()
                .contains("the input ends inside an opcode")
        );
    }
}
