//! The opcodes of the pickle machine, one function per family (the
//! machine itself, scalars, tuples and lists, dicts, objects, the memo),
//! each a match on the opcodes [`Machine::op`] hands it.

use std::sync::Arc;

use super::{Machine, opcode_name};
use crate::codec::chunked::Chunked;
use crate::codec::pickle::PickleError;
use crate::codec::pickle::value::{Object, Value, arena_index};

impl Machine<'_, '_> {
    /// Runs opcode `op`, its arguments read from the input after it: the
    /// value STOP leaves, None after every other opcode.
    pub(super) fn op(&mut self, op: u8) -> Result<Option<Value>, PickleError> {
        match op {
            0x80 | 0x95 | b'.' | b'(' | b'0' | b'1' | b'2' => return self.op_control(op),
            b'N' | 0x88 | 0x89 | b'J' | b'K' | b'M' | 0x8a | 0x8b | 0x8c | b'X' | 0x8d => {
                self.op_scalar(op)?
            }
            b')' | 0x85 | 0x86 | 0x87 | b't' | b']' | b'l' | b'a' | b'e' => self.op_sequence(op)?,
            b'}' | b'd' | b's' | b'u' => self.op_dict(op)?,
            b'c' | 0x93 | 0x81 | b'b' => self.op_object(op)?,
            0x94 | b'q' | b'r' | b'h' | b'j' => self.op_memo(op)?,
            other => return Err(self.unknown(other)),
        }
        Ok(None)
    }

    /// The error of an opcode a tracemalloc snapshot does not use.
    fn unknown(&self, op: u8) -> PickleError {
        self.err(format!(
            "opcode {} ({op:#04x}) is not one a tracemalloc snapshot uses",
            opcode_name(op)
        ))
    }

    /// The opcodes of the machine itself: PROTO, FRAME, STOP (the value it
    /// leaves), MARK, POP, POP_MARK, DUP.
    fn op_control(&mut self, op: u8) -> Result<Option<Value>, PickleError> {
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
                return Ok(Some(value));
            }
            b'(' => {
                // MARK
                if self.marks.len() >= self.marks_high {
                    self.charge_n(1, size_of::<usize>())?;
                    self.marks_high = self.marks.len() + 1;
                }
                self.marks.push(self.stack.len());
            }
            b'0' => {
                // POP
                self.pop()?;
            }
            b'1' => {
                // POP_MARK
                let mark = self.pop_mark()?;
                self.stack.truncate(mark);
            }
            b'2' => {
                // DUP
                let top = *self.top_mut()?;
                self.push(top)?;
            }
            other => return Err(self.unknown(other)),
        }
        Ok(None)
    }

    /// The opcodes that push a scalar: None, booleans, integers, strings.
    fn op_scalar(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'N' => self.push(Value::None)?,
            0x88 => self.push(Value::Bool(true))?,
            0x89 => self.push(Value::Bool(false))?,
            b'J' => {
                // BININT: signed 32-bit
                let v = self.le(4)? as u32 as i32;
                self.push(Value::Int(i64::from(v)))?;
            }
            b'K' => {
                // BININT1
                let v = self.le(1)?;
                self.push(Value::Int(v as i64))?;
            }
            b'M' => {
                // BININT2
                let v = self.le(2)?;
                self.push(Value::Int(v as i64))?;
            }
            0x8a => {
                // LONG1
                let n = self.le(1)? as usize;
                let bytes = self.take(n)?;
                let v = self.long(bytes)?;
                self.push(v)?;
            }
            0x8b => {
                // LONG4
                let n = self.le(4)? as u32 as i32;
                let n = usize::try_from(n).map_err(|_| self.err("LONG4 with a negative length"))?;
                let bytes = self.take(n)?;
                let v = self.long(bytes)?;
                self.push(v)?;
            }
            0x8c => {
                // SHORT_BINUNICODE
                let n = self.le(1)? as usize;
                let bytes = self.take(n)?;
                let v = self.string(bytes)?;
                self.push(v)?;
            }
            b'X' => {
                // BINUNICODE
                let n = self.le(4)? as usize;
                let bytes = self.take(n)?;
                let v = self.string(bytes)?;
                self.push(v)?;
            }
            0x8d => {
                // BINUNICODE8
                let n = usize::try_from(self.le(8)?).unwrap_or(usize::MAX);
                let bytes = self.take(n)?;
                let v = self.string(bytes)?;
                self.push(v)?;
            }
            other => return Err(self.unknown(other)),
        }
        Ok(())
    }

    /// The opcodes of tuples and lists: made empty, from the stack or a
    /// mark, appended to.
    fn op_sequence(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b')' => self.tuple_from(self.stack.len())?,
            0x85 => self.tuple_n(1)?,
            0x86 => self.tuple_n(2)?,
            0x87 => self.tuple_n(3)?,
            b't' => {
                let mark = self.pop_mark()?;
                self.tuple_from(mark)?;
            }
            b']' => {
                let index = arena_index(self.heap.lists.len(), self.op_at)?;
                self.charge_items::<Chunked<Value>>(1)?;
                self.heap.lists.push(Chunked::default());
                self.push(Value::List(index))?;
            }
            b'l' => {
                // LIST
                let mark = self.pop_mark()?;
                self.charge_n(self.stack.len() - mark, size_of::<Value>())?;
                let mut items = Chunked::default();
                for &item in self.stack.iter_from(mark) {
                    items.push(item);
                }
                self.stack.truncate(mark);
                let index = arena_index(self.heap.lists.len(), self.op_at)?;
                self.charge_items::<Chunked<Value>>(1)?;
                self.heap.lists.push(items);
                self.push(Value::List(index))?;
            }
            b'a' => {
                // APPEND
                let item = self.pop()?;
                let list = *self.top_mut()?;
                self.list_mut(list, 1)?.push(item);
            }
            b'e' => {
                // APPENDS
                let mark = self.pop_mark()?;
                let list = self.below(mark)?;
                let added = self.stack.len() - mark;
                self.list_mut(list, added)?;
                if let Value::List(i) = list
                    && let Some(items) = self.heap.lists.get_mut(i as usize)
                {
                    for &item in self.stack.iter_from(mark) {
                        items.push(item);
                    }
                }
                self.stack.truncate(mark);
            }
            other => return Err(self.unknown(other)),
        }
        Ok(())
    }

    /// The opcodes of dicts: made empty or from a mark, set items in.
    fn op_dict(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'}' => {
                let index = arena_index(self.heap.dicts.len(), self.op_at)?;
                self.charge_items::<Chunked<(Value, Value)>>(1)?;
                self.heap.dicts.push(Chunked::default());
                self.push(Value::Dict(index))?;
            }
            b'd' => {
                // DICT
                let mark = self.pop_mark()?;
                self.charge_n((self.stack.len() - mark) / 2, size_of::<(Value, Value)>())?;
                let pairs = self.pairs(mark)?;
                let index = arena_index(self.heap.dicts.len(), self.op_at)?;
                self.charge_items::<Chunked<(Value, Value)>>(1)?;
                self.heap.dicts.push(pairs);
                self.push(Value::Dict(index))?;
            }
            b's' => {
                // SETITEM
                let value = self.pop()?;
                let key = self.pop()?;
                let dict = *self.top_mut()?;
                self.dict_mut(dict, 1)?.push((key, value));
            }
            b'u' => {
                // SETITEMS
                let mark = self.pop_mark()?;
                let dict = self.below(mark)?;
                self.dict_mut(dict, (self.stack.len() - mark) / 2)?;
                if !(self.stack.len() - mark).is_multiple_of(2) {
                    return Err(self.err("an odd number of items for a dict"));
                }
                if let Value::Dict(i) = dict
                    && let Some(into) = self.heap.dicts.get_mut(i as usize)
                {
                    let mut items = self.stack.iter_from(mark).copied();
                    while let (Some(key), Some(value)) = (items.next(), items.next()) {
                        into.push((key, value));
                    }
                }
                self.stack.truncate(mark);
            }
            other => return Err(self.unknown(other)),
        }
        Ok(())
    }

    /// The opcodes of objects: GLOBAL and STACK_GLOBAL (the two tracemalloc
    /// classes only), NEWOBJ and BUILD (nothing is called).
    fn op_object(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'c' => {
                // GLOBAL "module\nname\n"
                let module = self.line()?;
                let name = self.line()?;
                let v = self.global(module, name)?;
                self.push(v)?;
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
                self.push(v)?;
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
                self.charge_items::<Object>(1)?;
                self.heap.objects.push(Object { class, state: None });
                self.push(Value::Object(index))?;
            }
            b'b' => {
                // BUILD: record the state; nothing is called.
                let state = self.pop()?;
                let object = *self.top_mut()?;
                let Value::Object(index) = object else {
                    return Err(self.err(format!("BUILD on a {}", object.kind())));
                };
                let offset = self.op_at;
                let slot =
                    self.heap
                        .objects
                        .get_mut(index as usize)
                        .ok_or(PickleError::Malformed {
                            offset,
                            reason: "BUILD on an unknown object".into(),
                        })?;
                if slot.state.is_some() {
                    return Err(self.err("BUILD twice on one object"));
                }
                slot.state = Some(state);
            }
            other => return Err(self.unknown(other)),
        }
        Ok(())
    }

    /// The opcodes of the memo: MEMOIZE, PUT and GET.
    fn op_memo(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
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
            other => return Err(self.unknown(other)),
        }
        Ok(())
    }
}
