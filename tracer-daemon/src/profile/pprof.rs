//! `format=pprof`: statistics or a compare as a gzipped `profile.proto`
//! (github.com/google/pprof, `proto/profile.proto`), the file `go tool
//! pprof` and its kin read. The messages are written here by hand with
//! `prost`'s derive (no protoc at build time); field numbers and types are
//! the `.proto`'s.
//!
//! What is in it:
//! - sample types `inuse_objects`/`count` then `inuse_space`/`bytes` (the
//!   order of Go's heap profiles), `inuse_space` the default;
//! - one sample per statistic (group), its locations most recent call
//!   first, its values `[count, size]`, or for a compare `[count_diff,
//!   size_diff]` (negative when memory went away; unchanged groups are
//!   left out);
//! - one location per distinct frame (function, file, line, module), with
//!   one line; no address (tracer's frames are `file:line`, their return
//!   addresses differ per process run);
//! - one function per (name, file): the frame's function, or `<unknown>`;
//!   a frame with no line info is named by its site, `FUNCTION+0xOFFSET`
//!   (else `MODULE+0xOFFSET`), its file the module (see
//!   [`Node::site_name`]): two sites are two functions, which `-top` and
//!   `-traces` show apart even within one function of a stripped binary;
//! - one mapping per module path (the executable or shared library of a
//!   frame, when known), the first one the first module that is not a
//!   shared object (the executable, which pprof names `File:`), with no address
//!   range, the module's build id when its frames carry one, flagged as
//!   symbolized so that pprof does not try to symbolize it again;
//! - comments naming what it shows (`tracer: statistics of pid 1234`).
use std::collections::HashMap;
use std::io::Write as _;

use flate2::{Compression, write::GzEncoder};
use prost::Message;

use super::stacks::{Node, Row, UNKNOWN_FUNCTION};

/// `perftools.profiles.Profile`.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `ValueType`: indices into the string table.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: leaf first.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label` (tracer writes none; here so that the message is complete).
#[derive(Clone, Copy, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `Mapping`.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `Location`.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// `Line`.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// `Function`.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Builds a [`Profile`]: interns strings, functions, mappings and
/// locations (ids from 1, in order of first use).
#[derive(Default)]
struct Builder<'a> {
    profile: Profile,
    strings: HashMap<&'a str, i64>,
    functions: HashMap<(&'a str, &'a str), u64>,
    /// By module path: the mapping's id and index.
    mappings: HashMap<&'a str, (u64, usize)>,
    locations: HashMap<Node<'a>, u64>,
}

impl<'a> Builder<'a> {
    fn new() -> Self {
        let mut builder = Builder::default();
        builder.string("");
        builder
    }

    fn string(&mut self, text: &'a str) -> i64 {
        let table = &mut self.profile.string_table;
        *self.strings.entry(text).or_insert_with(|| {
            table.push(text.to_string());
            i64::try_from(table.len() - 1).unwrap_or(i64::MAX)
        })
    }

    fn function(&mut self, name: &'a str, filename: &'a str) -> u64 {
        if let Some(&id) = self.functions.get(&(name, filename)) {
            return id;
        }
        let id = next_id(self.profile.function.len());
        let (name_index, file_index) = (self.string(name), self.string(filename));
        self.profile.function.push(Function {
            id,
            name: name_index,
            system_name: name_index,
            filename: file_index,
            start_line: 0,
        });
        self.functions.insert((name, filename), id);
        id
    }

    /// The mapping of `module`, with `build_id` once a frame gives one.
    fn mapping(&mut self, module: &'a str, build_id: Option<&'a str>) -> u64 {
        let build_id = build_id.map_or(0, |b| self.string(b));
        if let Some(&(id, index)) = self.mappings.get(module) {
            if let Some(mapping) = self.profile.mapping.get_mut(index)
                && mapping.build_id == 0
            {
                mapping.build_id = build_id;
            }
            return id;
        }
        let id = next_id(self.profile.mapping.len());
        let filename = self.string(module);
        self.profile.mapping.push(Mapping {
            id,
            filename,
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Mapping::default()
        });
        self.mappings
            .insert(module, (id, self.profile.mapping.len() - 1));
        id
    }

    fn location(&mut self, node: Node<'a>) -> u64 {
        if let Some(&id) = self.locations.get(&node) {
            return id;
        }
        let function_id = match node.site_name() {
            Some(site) => self.function(site, node.file()),
            None => self.function(node.function.unwrap_or(UNKNOWN_FUNCTION), node.filename),
        };
        let mapping_id = node.module.map_or(0, |m| self.mapping(m, node.build_id));
        let id = next_id(self.profile.location.len());
        self.profile.location.push(Location {
            id,
            mapping_id,
            address: 0,
            line: vec![Line {
                function_id,
                line: i64::from(node.lineno),
                column: 0,
            }],
            is_folded: false,
        });
        self.locations.insert(node, id);
        id
    }

    fn value_type(&mut self, kind: &'a str, unit: &'a str) -> ValueType {
        ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }
}

/// The id of the next item of a table of `len` items (ids start at 1).
fn next_id(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX).saturating_add(1)
}

/// The profile of `rows`: values `[count, size]` of statistics, or
/// `[count_diff, size_diff]` of a compare (`diff`: then the rows whose
/// differences are both 0 are left out). `comments` name what it shows.
#[must_use]
pub fn profile(rows: &[Row<'_>], diff: bool, comments: &[String]) -> Profile {
    let mut builder = Builder::new();
    let objects = builder.value_type("inuse_objects", "count");
    let space = builder.value_type("inuse_space", "bytes");
    builder.profile.sample_type = vec![objects, space];
    builder.profile.default_sample_type = space.r#type;
    for comment in comments {
        let index = builder.string(comment);
        builder.profile.comment.push(index);
    }
    // pprof takes the first mapping for the main binary (its `File:`): the
    // first module that is not a shared object.
    if let Some(node) = rows
        .iter()
        .flat_map(|row| &row.frames)
        .find(|node| node.module.is_some_and(|module| !module.contains(".so")))
        && let Some(module) = node.module
    {
        builder.mapping(module, node.build_id);
    }
    for row in rows {
        let value = if diff {
            if row.count_diff == 0 && row.size_diff == 0 {
                continue;
            }
            vec![row.count_diff, row.size_diff]
        } else {
            vec![
                i64::try_from(row.count).unwrap_or(i64::MAX),
                i64::try_from(row.size).unwrap_or(i64::MAX),
            ]
        };
        let location_id = row
            .frames
            .iter()
            .map(|&node| builder.location(node))
            .collect();
        builder.profile.sample.push(Sample {
            location_id,
            value,
            label: Vec::new(),
        });
    }
    builder.profile
}

/// `profile` encoded and gzipped, as `go tool pprof` reads it.
///
/// # Errors
/// What gzip reports (writing into memory: never in practice).
pub fn gzipped(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(&profile.encode_to_vec())?;
    gzip.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use std::io::Read as _;

    use flate2::read::GzDecoder;

    use super::*;

    fn node<'a>(function: Option<&'a str>, file: &'a str, line: u32) -> Node<'a> {
        Node::of(function, file, line, Some("/bin/app"))
    }

    #[test]
    fn profile_interns_frames_and_keeps_negative_differences() {
        let leaf = node(Some("alloc_a"), "a.c", 9);
        let caller = node(Some("main"), "a.c", 30);
        let unknown = node(None, "/lib/libc.so.6", 0);
        let rows = [
            Row {
                frames: vec![leaf, caller],
                count: 3,
                size: 300,
                count_diff: -2,
                size_diff: -200,
            },
            Row {
                frames: vec![unknown, caller],
                count: 1,
                size: 7,
                count_diff: 0,
                size_diff: 0,
            },
        ];
        let bytes = gzipped(&profile(&rows, true, &["tracer: test".into()])).unwrap();
        let mut raw = Vec::new();
        GzDecoder::new(&bytes[..]).read_to_end(&mut raw).unwrap();
        let decoded = Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| decoded.string_table[usize::try_from(i).unwrap()].as_str();
        let types: Vec<_> = decoded
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(
            types,
            [("inuse_objects", "count"), ("inuse_space", "bytes")]
        );
        assert_eq!(s(decoded.default_sample_type), "inuse_space");
        // The unchanged group is left out of a diff.
        assert_eq!(decoded.sample.len(), 1);
        assert_eq!(decoded.sample[0].value, [-2, -200]);
        assert_eq!(decoded.sample[0].location_id, [1, 2]);
        let names: Vec<_> = decoded
            .location
            .iter()
            .map(|l| {
                let f = decoded.function[usize::try_from(l.line[0].function_id - 1).unwrap()];
                (s(f.name), s(f.filename), l.line[0].line, l.mapping_id)
            })
            .collect();
        assert_eq!(names, [("alloc_a", "a.c", 9, 1), ("main", "a.c", 30, 1)]);
        assert_eq!(decoded.mapping.len(), 1);
        assert_eq!(s(decoded.mapping[0].filename), "/bin/app");
        assert_eq!(
            decoded.comment.iter().map(|&c| s(c)).collect::<Vec<_>>(),
            ["tracer: test"]
        );
        // Statistics keep every row, an unknown function named <unknown>.
        let stats = profile(&rows, false, &[]);
        assert_eq!(stats.sample.len(), 2);
        assert_eq!(stats.sample[1].value, [1, 7]);
        let f = stats.function[usize::try_from(stats.location[2].line[0].function_id - 1).unwrap()];
        assert_eq!(
            stats.string_table[usize::try_from(f.name).unwrap()],
            "<unknown>"
        );
    }

    #[test]
    fn sites_are_functions_of_their_own_and_modules_carry_their_build_id() {
        use tracer_model::{Frame, FrameExtra};
        let extra = |function: Option<&str>| FrameExtra {
            function: function.map(Into::into),
            module: Some("/usr/bin/app".into()),
            address: Some(1),
            build_id: Some("8e1f".into()),
        };
        // Two sites in one function, one with no function, a caller.
        let frames = [
            Frame::without_line("/usr/bin/app", Some("alloc"), 0x1f)
                .with_extra(extra(Some("alloc"))),
            Frame::without_line("/usr/bin/app", Some("alloc"), 0x2a)
                .with_extra(extra(Some("alloc"))),
            Frame::without_line("/usr/bin/app", None, 0x115f).with_extra(extra(None)),
            Frame::without_line("/usr/bin/app", Some("main"), 0x40).with_extra(extra(Some("main"))),
        ];
        let nodes: Vec<Node<'_>> = frames.iter().map(Node::of_site).collect();
        let row = |leaf: usize, size: u64| Row {
            frames: vec![nodes[leaf], nodes[3]],
            count: 1,
            size,
            count_diff: 1,
            size_diff: i64::try_from(size).unwrap(),
        };
        let decoded = profile(&[row(0, 300), row(1, 200), row(2, 100)], false, &[]);
        let s = |i: i64| decoded.string_table[usize::try_from(i).unwrap()].as_str();
        let functions: Vec<(&str, &str)> = decoded
            .function
            .iter()
            .map(|f| (s(f.name), s(f.filename)))
            .collect();
        assert_eq!(
            functions,
            [
                ("alloc+0x1f", "/usr/bin/app"),
                ("main+0x40", "/usr/bin/app"),
                ("alloc+0x2a", "/usr/bin/app"),
                ("/usr/bin/app+0x115f", "/usr/bin/app"),
            ]
        );
        assert_eq!(decoded.location.len(), 4);
        assert_eq!(
            decoded
                .sample
                .iter()
                .map(|s| s.location_id.clone())
                .collect::<Vec<_>>(),
            [vec![1, 2], vec![3, 2], vec![4, 2]]
        );
        assert_eq!(decoded.mapping.len(), 1);
        assert_eq!(s(decoded.mapping[0].filename), "/usr/bin/app");
        assert_eq!(s(decoded.mapping[0].build_id), "8e1f");
    }
}
