//! The uprobe programs loaded a second way, for uprobe_multi links
//! (Linux 6.6+): one link per program and object carries all that
//! object's probes of the program, and closing it unregisters them all
//! with one wait for the kernel's grace periods, not under the lock that
//! perf events' uprobes are unregistered under one after another. A stop
//! detaching hundreds of probes then takes a fraction of a second.
//!
//! The kernel takes such a link only for a program loaded with the
//! expected attach type `BPF_TRACE_UPROBE_MULTI`, which aya 0.14 cannot
//! set. So the same ELF object aya loaded is parsed again with `aya-obj`
//! (aya's own parser), its instructions relocated against the maps aya
//! created (the same kernel maps, so the global data set at load and
//! every map tracerd reads are the ones these programs use), and each
//! uprobe program loaded by [`crate::sys::uprobe_multi`]. When tracerd
//! samples, the allocating calls' entries and exit are one program for
//! uprobe session links instead (Linux 6.13+, [`SESSION_PROGRAM`]): a call
//! sampling passes over then skips its return probe.
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd},
};

use aya::{
    Ebpf,
    maps::{Map, MapData},
};

use tracer_common::{PROBES, SESSION_PROGRAM, session_kind};

use crate::sys::uprobe_multi::{self, LinkKind, ProgramBtf};

/// The uprobe programs loaded for uprobe_multi links, by name.
#[derive(Debug)]
pub(super) struct MultiPrograms {
    programs: HashMap<&'static str, OwnedFd>,
}

/// The ELF object parsed again and relocated against the maps of the
/// `Ebpf` aya loaded ([`MultiPrograms::prepare`]): what loading the
/// uprobe programs needs, and nothing of the `Ebpf` (so that they can be
/// verified on a thread of their own while aya loads the tracepoints).
pub(super) struct Prepared {
    obj: aya_obj::Object,
    btf: Option<OwnedFd>,
}

impl MultiPrograms {
    /// Parses the ELF object `object` (exactly the bytes `ebpf` was loaded
    /// from) and relocates its map references to the maps of `ebpf` (all
    /// of them still in it), for [`Prepared::load`].
    ///
    /// # Errors
    /// Why not, in words: the object does not parse or relocate, or a map
    /// is missing from `ebpf`.
    pub(super) fn prepare(object: &[u8], ebpf: &Ebpf) -> Result<Prepared, String> {
        let mut obj = aya_obj::Object::parse(object).map_err(|e| format!("parsing: {e}"))?;
        // The object's BTF, fixed up as aya fixes it (aya's copy is not
        // reachable): the verifier wants the programs' function records.
        let btf = match aya::features().btf() {
            Some(features) => obj
                .fixup_and_sanitize_btf(features)
                .map_err(|e| format!("fixing up BTF: {e}"))?
                .map(|btf| uprobe_multi::load_btf(&btf.to_bytes()))
                .transpose()
                .map_err(|e| format!("loading BTF: {e}"))?,
            None => None,
        };
        if obj.has_btf_relocations() {
            let btf = aya_obj::btf::Btf::from_sys_fs()
                .map_err(|e| format!("reading the kernel's BTF: {e}"))?;
            obj.relocate_btf(&btf)
                .map_err(|e| format!("relocating BTF: {e}"))?;
        }
        let maps = std::mem::take(&mut obj.maps);
        let mut with_fds = Vec::new();
        for (name, map) in &maps {
            let fd = ebpf
                .map(name)
                .and_then(map_data)
                .ok_or_else(|| format!("map {name} is not in the loaded object"))?;
            with_fds.push((name.as_str(), fd.fd().as_fd().as_raw_fd(), map));
        }
        let text_sections: HashSet<usize> =
            obj.functions.keys().map(|(section, _)| *section).collect();
        obj.relocate_maps(with_fds.into_iter(), &text_sections)
            .map_err(|e| format!("relocating maps: {e}"))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| format!("relocating calls: {e}"))?;
        obj.sanitize_functions(aya::features());
        Ok(Prepared { obj, btf })
    }
}

impl Prepared {
    /// Loads the programs `names` for uprobe_multi links, and checks that
    /// the kernel takes such links. With `session` (tracerd samples), first
    /// [`SESSION_PROGRAM`] for uprobe session links, in place of the
    /// programs of `names` it replaces ([`replaced_by_session`]), which are
    /// then not loaded; a kernel that refuses it (before Linux 6.13) gets
    /// them all, with a log line. The maps they refer to are those of the
    /// `Ebpf` this was prepared from, which must keep them until the load
    /// returns.
    ///
    /// # Errors
    /// Why not, in words: the kernel has no uprobe_multi links (before
    /// 6.6, or before its pid filter was fixed), a program is not in the
    /// object, or the verifier refused one (its log's end).
    pub(super) fn load(
        self,
        names: impl IntoIterator<Item = &'static str>,
        session: bool,
    ) -> Result<MultiPrograms, String> {
        let session = match session.then(|| self.load_one(SESSION_PROGRAM, LinkKind::Session)) {
            None => None,
            Some(Ok(fd)) if uprobe_multi::supported(fd.as_fd(), LinkKind::Session) => Some(fd),
            Some(result) => {
                let reason = result.err().unwrap_or_else(|| "no session links".into());
                tracing::warn!(
                    program = SESSION_PROGRAM,
                    %reason,
                    "no uprobe session links (Linux 6.13+): each allocator call keeps a uprobe and a uretprobe, and sampling costs what exact tracing does"
                );
                None
            }
        };
        let mut programs = HashMap::new();
        for name in names {
            if programs.contains_key(name) || session.is_some() && replaced_by_session(name) {
                continue;
            }
            let fd = self.load_one(name, LinkKind::Multi)?;
            if programs.is_empty() && !uprobe_multi::supported(fd.as_fd(), LinkKind::Multi) {
                return Err("this kernel has no uprobe_multi links filtered by process (Linux 6.10, or a stable kernel with the fix)".into());
            }
            programs.insert(name, fd);
        }
        if let Some(fd) = session {
            programs.insert(SESSION_PROGRAM, fd);
        }
        Ok(MultiPrograms { programs })
    }

    /// Loads program `name` for links of `kind`.
    ///
    /// # Errors
    /// Why not, in words: not in the object, or refused (the verifier's
    /// log's end).
    fn load_one(&self, name: &'static str, kind: LinkKind) -> Result<OwnedFd, String> {
        let program = self
            .obj
            .programs
            .get(name)
            .ok_or_else(|| format!("program {name} is not in the object"))?;
        let function = self
            .obj
            .functions
            .get(&program.function_key())
            .ok_or_else(|| format!("program {name} has no code"))?;
        let btf = self.btf.as_ref().map(|btf| ProgramBtf {
            btf: btf.as_fd(),
            func_info: &function.func_info.func_info,
            line_info: &function.line_info.line_info,
        });
        let started = std::time::Instant::now();
        let fd = uprobe_multi::load_program(
            name,
            kind,
            &function.instructions,
            &program.license,
            btf.as_ref(),
        )
        .map_err(|e| format!("loading {name}: {e}"))?;
        tracing::debug!(
            program = name,
            ms = started.elapsed().as_millis() as u64,
            "program verified"
        );
        Ok(fd)
    }
}

/// Whether program `name` is one that [`SESSION_PROGRAM`] replaces: an
/// entry of [`SESSION_ENTRIES`], or the exit of one.
pub(super) fn replaced_by_session(name: &str) -> bool {
    session_kind(name).is_some()
        || PROBES
            .iter()
            .any(|spec| session_kind(spec.entry).is_some() && spec.exit == Some(name))
}

impl MultiPrograms {
    /// Program `name`, if loaded.
    pub(super) fn program(&self, name: &str) -> Option<BorrowedFd<'_>> {
        self.programs.get(name).map(AsFd::as_fd)
    }

    /// Whether [`SESSION_PROGRAM`] is loaded: the calls of
    /// [`SESSION_ENTRIES`](tracer_common::SESSION_ENTRIES) are probed by
    /// session links.
    pub(super) fn session(&self) -> bool {
        self.programs.contains_key(SESSION_PROGRAM)
    }

    /// Each program by name, with a descriptor of its own (for
    /// [`KernelStats`](super::usage::KernelStats)).
    pub(super) fn fds(&self) -> impl Iterator<Item = (String, std::io::Result<OwnedFd>)> + '_ {
        self.programs
            .iter()
            .map(|(name, fd)| ((*name).to_string(), fd.as_fd().try_clone_to_owned()))
    }
}

/// The map of `map`, for the kinds tracer's object has (an unexpected
/// kind is None, and the load says which map).
fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::Array(data)
        | Map::HashMap(data)
        | Map::LruHashMap(data)
        | Map::PerCpuArray(data)
        | Map::PerCpuHashMap(data)
        | Map::PerCpuLruHashMap(data)
        | Map::ProgramArray(data)
        | Map::HashOfMaps(data)
        | Map::RingBuf(data)
        | Map::StackTraceMap(data)
        | Map::Unsupported(data) => Some(data),
        _ => None,
    }
}
