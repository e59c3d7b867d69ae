//! The pickle virtual machine, restricted to data: the opcodes that
//! protocols 2 to 5 use for a `tracemalloc.Snapshot`, run without
//! executing anything; every other opcode, and every global but the two
//! tracemalloc classes, is refused with its name and offset.
//!
//! This module holds the machine and its stacks; the opcodes are [`ops`],
//! one function per family.

use std::collections::HashMap;
use std::sync::Arc;

mod ops;

use super::PickleError;
use super::value::{Class, Heap, Value, arena_index};
use crate::codec::budget::{Budget, OverBudget, cost};
use crate::codec::chunked::Chunked;
use crate::codec::chunked::SlabRef;
use crate::codec::intern::intern;

/// Runs the pickle `bytes` up to its STOP: the value left on the stack and
/// the objects made. Refuses input that does not start with PROTO or that
/// goes on after STOP. Every value stored (on the stack, in the memo, a
/// list, a tuple or a dict) is charged to `budget` before it is stored:
/// `DUP`, `MEMOIZE` and `GET` are checked as they run. Every table here is
/// [`Chunked`], which grows without copying, so that what is charged (the
/// length) is what the memory holds. Each opcode is a step of the
/// interrupt check.
pub(super) fn run(bytes: &[u8], budget: &mut Budget) -> Result<(Value, Heap), PickleError> {
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
        stack: Chunked::default(),
        marks: Chunked::default(),
        memo: Chunked::default(),
        heap: Heap::default(),
        interned: HashMap::new(),
        budget,
        stack_high: 0,
        marks_high: 0,
    };
    let root = machine.run()?;
    if machine.at != bytes.len() {
        return Err(PickleError::Malformed {
            offset: machine.at,
            reason: format!("{} bytes after STOP", bytes.len() - machine.at),
        });
    }
    Ok((root, machine.heap))
}

/// The pickle virtual machine, restricted to data.
struct Machine<'a, 'b> {
    input: &'a [u8],
    at: usize,
    /// Offset of the opcode being run, for errors.
    op_at: usize,
    stack: Chunked<Value>,
    marks: Chunked<usize>,
    memo: Chunked<Value>,
    heap: Heap,
    /// Equal strings share one `Arc` (file names repeat a lot).
    interned: HashMap<Arc<str>, u32>,
    /// What the values stored may still take.
    budget: &'b mut Budget,
    /// The highest depth the stack reached (all of it charged).
    stack_high: usize,
    /// The most MARKs open at once (all of them charged).
    marks_high: usize,
}

/// Where the machine is, for [`OverBudget`]: the opcode's offset and name.
fn here(input: &[u8], op_at: usize) -> String {
    let op = input.get(op_at).copied().unwrap_or(0);
    format!("byte {op_at} (opcode {})", opcode_name(op))
}

impl<'a> Machine<'a, '_> {
    /// Charges `count` items of `each` bytes at the current opcode.
    fn charge_n(&mut self, count: usize, each: usize) -> Result<(), OverBudget> {
        let (input, op_at) = (self.input, self.op_at);
        self.budget
            .charge_n(count, each as u64, || here(input, op_at))
    }

    /// Charges `count` more items of `T` (in a [`Chunked`] or a slab).
    fn charge_items<T>(&mut self, count: usize) -> Result<(), OverBudget> {
        self.charge_n(count, size_of::<T>())
    }

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

    /// Pops the last MARK: the items above it are `stack[mark..]`.
    fn pop_mark(&mut self) -> Result<usize, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK to pop to"))?;
        if mark > self.stack.len() {
            return Err(self.err("MARK above the stack"));
        }
        Ok(mark)
    }

    /// The value just below a popped MARK at `mark` (the list or dict that
    /// APPENDS or SETITEMS add to), which must be above the MARK before.
    fn below(&self, mark: usize) -> Result<Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        match mark.checked_sub(1) {
            Some(i) if i >= floor => self
                .stack
                .get(i)
                .copied()
                .ok_or_else(|| self.err("the stack is empty")),
            _ => Err(self.err("the stack is empty")),
        }
    }

    /// Pushes `value`. The stack is charged by its highest depth (its
    /// slots are reused after pops).
    fn push(&mut self, value: Value) -> Result<(), PickleError> {
        if self.stack.len() >= self.stack_high {
            self.charge_n(1, size_of::<Value>())?;
            self.stack_high = self.stack.len() + 1;
        }
        self.stack.push(value);
        Ok(())
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
        self.charge_n(1, 2 * text.len() + cost::STRING as usize)?;
        self.charge_items::<Arc<str>>(1)?;
        let shared: Arc<str> = intern(text);
        self.heap.strings.push(Arc::clone(&shared));
        self.interned.insert(shared, index);
        Ok(Value::Str(index))
    }

    /// Replaces `stack[from..]` by the tuple of those items.
    fn tuple_from(&mut self, from: usize) -> Result<(), PickleError> {
        let len = self.stack.len().saturating_sub(from);
        let index = arena_index(self.heap.tuples.len(), self.op_at)?;
        arena_index(len, self.op_at)?;
        self.charge_n(len, size_of::<Value>())?;
        self.charge_items::<SlabRef>(1)?;
        let at = self
            .heap
            .tuple_items
            .push_slice(len, self.stack.iter_from(from).copied())
            .ok_or_else(|| self.err("too many objects"))?;
        self.heap.tuples.push(at);
        self.stack.truncate(from);
        self.push(Value::Tuple(index))
    }

    fn tuple_n(&mut self, n: usize) -> Result<(), PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() < floor + n {
            return Err(self.err(format!("TUPLE{n} needs {n} items on the stack")));
        }
        self.tuple_from(self.stack.len() - n)
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
            self.charge_items::<Value>(1)?;
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
        self.push(value)
    }

    fn long(&mut self, bytes: &[u8]) -> Result<Value, PickleError> {
        if bytes.is_empty() {
            return Ok(Value::Int(0));
        }
        if bytes.len() > 16 {
            return Ok(Value::BigInt);
        }
        let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
        let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
        if let Some(dst) = buf.get_mut(..bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        let v = i128::from_le_bytes(buf);
        if let Some(value) = Value::int(v) {
            return Ok(value);
        }
        let index = arena_index(self.heap.wide.len(), self.op_at)?;
        self.charge_items::<i128>(1)?;
        self.heap.wide.push(v);
        Ok(Value::Wide(index))
    }

    /// Runs the opcodes up to STOP; returns the value left on the stack.
    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            self.budget.tick()?;
            self.op_at = self.at;
            let op = *self
                .input
                .get(self.at)
                .ok_or_else(|| self.err("the input ends before STOP"))?;
            self.at += 1;
            if let Some(value) = self.op(op)? {
                return Ok(value);
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

    /// Takes `stack[mark..]` as key, value pairs (charged by DICT, which
    /// keeps them).
    fn pairs(&mut self, mark: usize) -> Result<Chunked<(Value, Value)>, PickleError> {
        if !(self.stack.len().saturating_sub(mark)).is_multiple_of(2) {
            return Err(self.err("an odd number of items for a dict"));
        }
        let mut pairs = Chunked::default();
        {
            let mut items = self.stack.iter_from(mark).copied();
            while let (Some(key), Some(value)) = (items.next(), items.next()) {
                pairs.push((key, value));
            }
        }
        self.stack.truncate(mark);
        Ok(pairs)
    }

    /// The list `list`, with room (charged) for `additional` more items.
    fn list_mut(
        &mut self,
        list: Value,
        additional: usize,
    ) -> Result<&mut Chunked<Value>, PickleError> {
        let (input, offset) = (self.input, self.op_at);
        let fail = |kind: &str| PickleError::Malformed {
            offset,
            reason: format!("APPEND to a {kind}"),
        };
        let items = match list {
            Value::List(i) => self
                .heap
                .lists
                .get_mut(i as usize)
                .ok_or_else(|| fail("list"))?,
            other => return Err(fail(other.kind())),
        };
        self.budget
            .charge_n(additional, size_of::<Value>() as u64, || {
                here(input, offset)
            })?;
        Ok(items)
    }

    /// The dict `dict`, with room (charged) for `additional` more pairs.
    fn dict_mut(
        &mut self,
        dict: Value,
        additional: usize,
    ) -> Result<&mut Chunked<(Value, Value)>, PickleError> {
        let (input, offset) = (self.input, self.op_at);
        let fail = |kind: &str| PickleError::Malformed {
            offset,
            reason: format!("SETITEM on a {kind}"),
        };
        let pairs = match dict {
            Value::Dict(i) => self
                .heap
                .dicts
                .get_mut(i as usize)
                .ok_or_else(|| fail("dict"))?,
            other => return Err(fail(other.kind())),
        };
        self.budget
            .charge_n(additional, size_of::<(Value, Value)>() as u64, || {
                here(input, offset)
            })?;
        Ok(pairs)
    }
}

/// pickletools' name of an opcode, for errors.
fn opcode_name(op: u8) -> &'static str {
    match op {
        0x80 => "PROTO",
        0x95 => "FRAME",
        b'.' => "STOP",
        b'(' => "MARK",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'N' => "NONE",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'M' => "BININT2",
        0x8a => "LONG1",
        0x8b => "LONG4",
        0x8c => "SHORT_BINUNICODE",
        b'X' => "BINUNICODE",
        0x8d => "BINUNICODE8",
        b')' => "EMPTY_TUPLE",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        b't' => "TUPLE",
        b']' => "EMPTY_LIST",
        b'l' => "LIST",
        b'a' => "APPEND",
        b'e' => "APPENDS",
        b'}' => "EMPTY_DICT",
        b'd' => "DICT",
        b's' => "SETITEM",
        b'u' => "SETITEMS",
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        0x81 => "NEWOBJ",
        b'b' => "BUILD",
        0x94 => "MEMOIZE",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b'h' => "BINGET",
        b'j' => "LONG_BINGET",
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
