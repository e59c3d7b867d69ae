//! `load_tracemalloc`: a tracemalloc snapshot from the objects the pickle
//! machine made, checked for the shape `Snapshot.dump()` writes, with
//! equal tracebacks sharing one `Arc` and the frame numbers handed to the
//! snapshot's index.

use std::collections::HashMap;
use std::sync::Arc;

use super::value::{Class, Heap, Value};
use super::{PickleError, shape, vm};
use crate::codec::budget::{Budget, cost};
use crate::engine::index::FrameHints;
use crate::hash::FxHashMap;
use crate::snapshot::Snapshot;
use crate::trace::{Frame, Trace, Traceback};

/// Parses a file written by Python's `tracemalloc.Snapshot.dump()` (pickle
/// protocol 2 to 5) into a snapshot, without executing anything.
///
/// Equal tracebacks share one `Arc` (whether the pickle memoized them as
/// one tuple or not), as the model's grouping prefers.
///
/// Memory is bounded by
/// [`LOAD_BYTES_PER_INPUT_BYTE`](crate::LOAD_BYTES_PER_INPUT_BYTE) bytes
/// per byte of `bytes` plus [`LOAD_BASE_BYTES`](crate::LOAD_BASE_BYTES)
/// and time is linear in its length (`tracer-model/src/codec/budget.rs`): the
/// values the opcodes store and every frame, traceback and trace the
/// conversion makes are charged before they are made.
///
/// # Errors
/// [`PickleError::Malformed`] for a pickle this parser does not read
/// (naming the opcode and offset); [`PickleError::Shape`] when the values
/// are not a tracemalloc snapshot or do not fit the model (e.g. a size of
/// 2**64 or more, a negative domain, an empty traceback);
/// [`PickleError::OverBudget`] past the memory bound;
/// [`PickleError::Interrupted`] when the thread's interrupt check
/// ([`crate::interrupt`]) says to stop.
pub fn load_tracemalloc(bytes: &[u8]) -> Result<Snapshot, PickleError> {
    load_with(bytes, &mut Budget::for_input(bytes.len()))
}

/// [`load_tracemalloc`], charging what it materialises to `budget`.
pub(crate) fn load_with(bytes: &[u8], budget: &mut Budget) -> Result<Snapshot, PickleError> {
    let (root, heap) = vm::run(bytes, budget)?;
    let mut converter = Converter {
        budget,
        heap: &heap,
        names: FxHashMap::default(),
        frames: FxHashMap::default(),
        by_text: FxHashMap::default(),
        table: Vec::new(),
        frame_lists: FxHashMap::default(),
        lists_by_content: HashMap::new(),
        tracebacks: FxHashMap::default(),
        by_content: HashMap::new(),
        interned: Vec::new(),
        hints: FrameHints::default(),
    };
    let parts = converter.snapshot(root)?;
    // The parsed values are no longer needed: free them before indexing.
    drop(converter);
    drop(heap);
    Ok(parts.into_snapshot())
}

/// A traceback's shared `Arc` and its index in order of first appearance.
type Interned = (Arc<Traceback>, u32);

/// A traceback tuple's frames (as a traceback with no `total_nframe`,
/// its hash computed once), and where their numbers are in the hints.
type FrameList = (Traceback, (usize, usize));

/// Builds the model's snapshot from the parsed values.
struct Converter<'h, 'b> {
    /// What the snapshot may still take.
    budget: &'b mut Budget,
    heap: &'h Heap,
    names: FxHashMap<u32, Arc<str>>,
    /// Each frame tuple: its number (the index's hint).
    frames: FxHashMap<u32, u32>,
    /// Each distinct frame (the address of its interned file name, and
    /// its line): its number. Python writes a tuple per frame of each
    /// traceback, so most tuples are equal to one seen before.
    by_text: FxHashMap<(usize, u32), u32>,
    /// The frames by number.
    table: Vec<Frame>,
    /// Each traceback tuple: its frames and where their numbers are in
    /// `hints.ids`.
    frame_lists: FxHashMap<u32, FrameList>,
    /// Equal frame lists from separate tuples share one array, so that
    /// tracebacks compare by address.
    lists_by_content: HashMap<Traceback, FrameList>,
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
    heap: &Heap,
    value: Value,
    what: impl std::fmt::Display,
    range: &str,
) -> Result<T, PickleError> {
    if let Some(v) = heap.int(value) {
        return T::try_from(v)
            .map_err(|_| shape(format!("{what} {v} is out of range (must be {range})")));
    }
    match value {
        Value::BigInt => Err(shape(format!("{what} is out of range (must be {range})"))),
        other => Err(shape(format!("{what} is a {}, not an int", other.kind()))),
    }
}

impl Converter<'_, '_> {
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

    /// The number of the frame of a `(filename, lineno)` tuple (its frame
    /// is in `table`).
    fn frame(&mut self, value: Value, at: At) -> Result<u32, PickleError> {
        let Value::Tuple(index) = value else {
            return Err(shape(format!(
                "{at} is a {}, not a (filename, lineno) tuple",
                value.kind()
            )));
        };
        if let Some(&number) = self.frames.get(&index) {
            return Ok(number);
        }
        let &[filename, lineno] = self.heap.tuple(index) else {
            return Err(shape(format!("{at} is not a (filename, lineno) pair")));
        };
        // tracer writes a frame with no line info as its site's name:
        // read back, that name is a site again (see `Frame`).
        let frame = Frame::from_tracemalloc(
            self.name(filename, at)?,
            int_in(self.heap, lineno, at.field("lineno"), "0 to 4294967295")?,
        );
        let key = (
            Arc::as_ptr(&frame.filename).cast::<u8>() as usize,
            frame.lineno,
        );
        if let Some(&number) = self.by_text.get(&key) {
            self.budget.charge(cost::FRAME_TUPLE, || {
                format!("{at} (frame tuple {})", self.frames.len())
            })?;
            self.frames.insert(index, number);
            return Ok(number);
        }
        self.budget.charge(cost::FRAME + cost::FRAME_TUPLE, || {
            format!("{at} (frame {})", self.table.len())
        })?;
        let number = u32::try_from(self.table.len()).unwrap_or(u32::MAX);
        self.frames.insert(index, number);
        self.by_text.insert(key, number);
        self.table.push(frame);
        self.hints.count = self.table.len();
        Ok(number)
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
        let (list, span) = match self.frame_lists.get(&index) {
            Some((list, span)) => (list.clone(), *span),
            None => {
                let (list, span) = self.frame_list(index, at)?;
                self.frame_lists.insert(index, (list.clone(), span));
                (list, span)
            }
        };
        // Shares the frames and their hash: no pass over them.
        let fresh = Arc::new(list.with_total_nframe(total_nframe));
        let next = u32::try_from(self.interned.len()).unwrap_or(u32::MAX);
        let (traceback, id) = {
            let (traceback, id) = self
                .by_content
                .entry((Arc::clone(&fresh), total_nframe))
                .or_insert_with(|| (fresh, next));
            (Arc::clone(traceback), *id)
        };
        if id == next {
            // A new traceback: the index copies its frame numbers.
            let depth = traceback.frames().len();
            self.budget.charge(
                cost::TRACEBACK + (depth as u64).saturating_mul(cost::SHARED_FRAME_REF),
                || format!("{at} (traceback {next}, {depth} frames)"),
            )?;
            self.interned.push(Arc::clone(&traceback));
            self.hints.spans.push(span);
        }
        self.tracebacks
            .insert((index, total_nframe), (Arc::clone(&traceback), id));
        Ok((traceback, id))
    }

    /// The frames of traceback tuple `index` (charged before they are
    /// made), shared with an equal list made before.
    fn frame_list(&mut self, index: u32, at: At) -> Result<FrameList, PickleError> {
        let items = self.heap.tuple(index);
        if items.is_empty() {
            return Err(shape(format!(
                "{at}: the traceback has no frame (tracemalloc records at least one)"
            )));
        }
        let depth = items.len();
        self.budget.charge(
            cost::TRACEBACK + (depth as u64).saturating_mul(cost::FRAME_REF),
            || format!("{at} (a traceback of {depth} frames)"),
        )?;
        let start = self.hints.ids.len();
        self.budget
            .grow(&mut self.hints.ids, depth, || format!("{at}"))?;
        for (i, &item) in items.iter().enumerate() {
            self.budget.tick()?;
            let number = self.frame(item, at.frame(i))?;
            self.hints.ids.push(number);
        }
        // Collected from an exact-size iterator: one allocation, no copy.
        let frames: Arc<[Frame]> = self
            .hints
            .ids
            .get(start..)
            .unwrap_or(&[])
            .iter()
            .map(|&n| {
                self.table
                    .get(n as usize)
                    .cloned()
                    .unwrap_or_else(Frame::unknown)
            })
            .collect();
        let list = Traceback::from_frames(frames, None);
        if let Some(equal) = self.lists_by_content.get(&list) {
            // Its numbers are those of the equal list.
            self.hints.ids.truncate(start);
            return Ok(equal.clone());
        }
        let made = (list, (start, self.hints.ids.len()));
        self.lists_by_content.insert(made.0.clone(), made.clone());
        Ok(made)
    }

    fn snapshot(&mut self, root: Value) -> Result<Parts, PickleError> {
        let state = self.object_state(root, Class::Snapshot, "the pickled object")?;
        let limit = self
            .heap
            .dict_get(state, "traceback_limit")
            .ok_or_else(|| shape("Snapshot has no traceback_limit"))?;
        let traceback_limit: u32 = int_in(self.heap, limit, "traceback_limit", "0 to 4294967295")?;
        let traces = self
            .heap
            .dict_get(state, "traces")
            .ok_or_else(|| shape("Snapshot has no traces"))?;
        let traces_state = self.object_state(traces, Class::Traces, "Snapshot.traces")?;
        let raw = self
            .heap
            .dict_get(traces_state, "_traces")
            .ok_or_else(|| shape("Snapshot.traces has no _traces"))?;
        let heap = self.heap;
        let (count, items): (usize, Box<dyn Iterator<Item = &Value>>) = match raw {
            Value::List(i) => match heap.lists.get(i as usize) {
                Some(list) => (list.len(), Box::new(list.iter())),
                None => (0, Box::new(std::iter::empty())),
            },
            Value::Tuple(i) => {
                let tuple = heap.tuple(i);
                (tuple.len(), Box::new(tuple.iter()))
            }
            other => {
                return Err(shape(format!(
                    "Snapshot.traces._traces is a {}",
                    other.kind()
                )));
            }
        };
        self.budget
            .charge_n(count, cost::TRACE, || format!("its {count} traces"))?;
        let mut out = Vec::with_capacity(count);
        let mut ids = Vec::with_capacity(count);
        for (n, &item) in items.enumerate() {
            self.budget.tick()?;
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
                v => Some(int_in(
                    self.heap,
                    v,
                    at.field("total_nframe"),
                    "0 to 4294967295",
                )?),
            };
            let (traceback, id) = self.traceback(traceback, total_nframe, at)?;
            out.push(Trace {
                source: crate::trace::AllocatorFamily::UNKNOWN,
                domain: int_in(self.heap, domain, at.field("domain"), "0 to 4294967295")?,
                size: int_in(self.heap, size, at.field("size"), "0 to 2**64-1")?,
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
