//! The tracepoints: the lifecycle ones, the mapping one, and the
//! anonymous-mapping programs chained through `MMAP_PROGRAMS`; each
//! verified ahead of its attach where it can be ([`verify_tracepoints`]).
use aya::{
    Ebpf,
    programs::{TracePoint, trace_point::TracePointLinkId},
};
use tracer_common::{
    MAP_MMAP_PROGRAMS, MAPPING_TRACEPOINT, MMAP_ADD_PROGRAM, MMAP_TAIL_ADD, MMAP_TAIL_UNMAP,
    MMAP_TRACEPOINTS, MMAP_UNMAP_PROGRAM, TRACEPOINTS,
};

use super::super::{CaptureConfig, CaptureError};
use super::{Programs, program_mut};

/// Verifies (loads) each of `programs` that is a tracepoint program not
/// loaded yet, ahead of its attach. One that fails stays unloaded: it is
/// loaded again where it is attached, which reports why.
pub(super) fn verify_tracepoints(programs: Vec<&mut aya::programs::Program>) {
    for program in programs {
        if let aya::programs::Program::TracePoint(program) = program
            && program.fd().is_err()
        {
            let started = std::time::Instant::now();
            if program.load().is_ok() {
                tracing::debug!(
                    ms = started.elapsed().as_millis() as u64,
                    "program verified ahead of its attach"
                );
            }
        }
    }
}

/// Loads `program` unless it is loaded already (by [`verify_tracepoints`]).
///
/// # Errors
/// aya's, when the kernel refuses it.
fn load_once(program: &mut TracePoint) -> Result<(), aya::programs::ProgramError> {
    if program.fd().is_ok() {
        return Ok(());
    }
    program.load()
}

/// Loads and attaches the lifecycle tracepoints ([`TRACEPOINTS`]), then
/// the optional ones: the mapping tracepoint, and the anonymous-mapping
/// ones when `config.trace_mmap` (tracer's own programs only). Returns
/// their links.
///
/// # Errors
/// [`CaptureError::Program`] or [`CaptureError::Attach`] naming the
/// lifecycle tracepoint that failed.
pub(super) fn attach_tracepoints(
    ebpf: &mut Ebpf,
    config: &CaptureConfig,
    programs: Programs,
) -> Result<Vec<(&'static str, TracePointLinkId)>, CaptureError> {
    let mut tracepoint_links = Vec::new();
    for (name, category, event) in TRACEPOINTS {
        let program: &mut TracePoint = program_mut(ebpf, name)?;
        let started = std::time::Instant::now();
        load_once(program).map_err(|source| CaptureError::Program {
            program: name.into(),
            source: Box::new(source),
        })?;
        tracing::debug!(
            program = name,
            ms = started.elapsed().as_millis() as u64,
            "program verified"
        );
        let link = program
            .attach(category, event)
            .map_err(|source| CaptureError::Attach {
                program: name.into(),
                target: format!("{category}:{event}"),
                source: Box::new(source),
            })?;
        tracepoint_links.push((name, link));
    }
    tracepoint_links.extend(attach_mapping_tracepoint(ebpf));
    if config.trace_mmap && programs == Programs::Tracer {
        tracepoint_links.extend(attach_mmap_tracepoints(ebpf));
    }
    Ok(tracepoint_links)
}

/// Attaches [`MMAP_TRACEPOINTS`] (anonymous mappings as blocks), once both
/// programs are loaded and in the prog array through which each
/// tail-calls the other; a kernel without syscall tracepoints, or
/// either program or slot missing, gets a warning and no `mmap` source
/// (not half of it: an `mremap` that unmaps a block but records no new
/// one would lose it).
fn attach_mmap_tracepoints(ebpf: &mut Ebpf) -> Vec<(&'static str, TracePointLinkId)> {
    if let Err(err) = chain_mmap_programs(ebpf) {
        tracing::warn!(err = %err, "anonymous mappings are not traced");
        return Vec::new();
    }
    let links: Vec<_> = MMAP_TRACEPOINTS
        .into_iter()
        .filter_map(|tracepoint| {
            attach_optional_tracepoint(ebpf, tracepoint, "anonymous mappings are not traced")
        })
        .collect();
    if links.len() < MMAP_TRACEPOINTS.len() {
        // Detached, as the warning above says.
        for (name, link) in links {
            if let Ok(program) = program_mut::<TracePoint>(ebpf, name) {
                let _ = program.detach(link);
            }
        }
        return Vec::new();
    }
    links
}

/// Loads both anonymous-mapping programs and puts each in its slot of
/// `MMAP_PROGRAMS` ([`MMAP_TAIL_UNMAP`], [`MMAP_TAIL_ADD`]). The prog array
/// stays in `ebpf`, open for tracerd's life: the kernel empties a prog
/// array once no process holds it open.
///
/// # Errors
/// The program or map that failed, and the kernel's reason.
fn chain_mmap_programs(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    let mut fds = Vec::new();
    for (slot, name) in [
        (MMAP_TAIL_UNMAP, MMAP_UNMAP_PROGRAM),
        (MMAP_TAIL_ADD, MMAP_ADD_PROGRAM),
    ] {
        let program: &mut TracePoint = program_mut(ebpf, name)?;
        load_once(program).map_err(|source| CaptureError::Program {
            program: name.into(),
            source: Box::new(source),
        })?;
        let fd = program.fd().map_err(|source| CaptureError::Program {
            program: name.into(),
            source: Box::new(source),
        })?;
        fds.push((
            slot,
            fd.try_clone()
                .map_err(|e| CaptureError::Load(e.to_string()))?,
        ));
    }
    let map = ebpf.map_mut(MAP_MMAP_PROGRAMS).ok_or_else(|| {
        CaptureError::Load(format!("map {MAP_MMAP_PROGRAMS} is not in the object"))
    })?;
    let mut programs = aya::maps::ProgramArray::try_from(map)
        .map_err(|e| CaptureError::Load(format!("map {MAP_MMAP_PROGRAMS}: {e}")))?;
    for (slot, fd) in &fds {
        programs.set(*slot, fd, 0).map_err(|e| {
            CaptureError::Load(format!("map {MAP_MMAP_PROGRAMS}, slot {slot}: {e}"))
        })?;
    }
    Ok(())
}

/// Attaches [`MAPPING_TRACEPOINT`] (prompt news of a library mapped, for
/// allocator discovery and the unwinder); a kernel without syscall
/// tracepoints gets a warning, and both their periodic refresh only.
fn attach_mapping_tracepoint(ebpf: &mut Ebpf) -> Option<(&'static str, TracePointLinkId)> {
    attach_optional_tracepoint(
        ebpf,
        MAPPING_TRACEPOINT,
        "libraries loaded later are unwound from the next refresh (within 1 s)",
    )
}

/// Loads and attaches the tracepoint program (program, category, name)
/// that tracerd can do without, and returns its link; when it cannot,
/// logs a warning that says `without` (what is lost).
fn attach_optional_tracepoint(
    ebpf: &mut Ebpf,
    (name, category, event): (&'static str, &str, &str),
    without: &str,
) -> Option<(&'static str, TracePointLinkId)> {
    let attached = program_mut::<TracePoint>(ebpf, name).and_then(|program| {
        let started = std::time::Instant::now();
        load_once(program).map_err(|e| CaptureError::Load(e.to_string()))?;
        tracing::debug!(
            program = name,
            ms = started.elapsed().as_millis() as u64,
            "program verified"
        );
        program
            .attach(category, event)
            .map_err(|e| CaptureError::Load(e.to_string()))
    });
    match attached {
        Ok(link) => Some((name, link)),
        Err(err) => {
            tracing::warn!(
                err = %err,
                tracepoint = %format!("{category}:{event}"),
                "{without}"
            );
            None
        }
    }
}
