//! The default `allocator_frames` (what `Config::default()` holds, and
//! `deploy/tracerd.toml` spells out), by family. The names as the real
//! programs spell them that they must and must not match are
//! `snapshot::frame_patterns`' tests, beside the matcher.

/// The default patterns (what `Config::default()` holds): pprof's
/// `drop_frames` for the allocators and wrappers found on Linux hosts,
/// and the allocation layers of the services they run (PostgreSQL, nginx,
/// V8 and Node.js, HotSpot, APR, talloc).
pub(in crate::config) fn defaults() -> Vec<String> {
    [
        CXX,
        RUST,
        GLIB,
        XMALLOC,
        LIBC,
        CPYTHON,
        SQLITE,
        OPENSSL,
        GLIB_STRINGS,
        POSTGRESQL,
        NGINX,
        V8_NODE,
        HOTSPOT,
        APR,
        TALLOC,
    ]
    .concat()
    .into_iter()
    .map(String::from)
    .collect()
}

/// C++: every operator new and new[] (plain, nothrow, align_val_t),
/// the standard library's allocator templates and the code leading
/// to them, and anything in libstdc++ or libc++ itself.
const CXX: &[&str] = &[
    "operator new*",
    "std::*",
    "__gnu_cxx::*",
    "module:*/libstdc++.so*",
    "module:*/libc++.so*",
    "module:*/libc++abi.so*",
];

/// Rust: the allocator shims (`__rustc::__rust_alloc` in recent
/// Rust; plain or mangled when names were not demangled), the
/// `GlobalAlloc`/`Allocator` impls, and alloc, core, std and
/// hashbrown (how Vec, String, Box and HashMap reach them).
const RUST: &[&str] = &[
    "__rust_alloc",
    "__rust_alloc_zeroed",
    "__rust_realloc",
    "__rdl_*",
    "__rg_*",
    "__rustc::*",
    "_R*___rust_alloc*",
    "_R*___rust_realloc*",
    "_R*___rdl_*",
    "_R*___rg_*",
    "_ZN*__rust_alloc*",
    "_ZN*__rust_realloc*",
    "_ZN*__rdl_*",
    "_ZN*__rg_*",
    "_ZN5alloc*",
    "_ZN4core*",
    "_ZN3std*",
    "_ZN9hashbrown*",
    "alloc::*",
    "<alloc::*",
    "core::*",
    "<core::*",
    // (std::* is above, for C++ and Rust alike.)
    "<std::*",
    "hashbrown::*",
    "<hashbrown::*",
    "<str>::*",
    "<[*]>::*",
    // A method of one of alloc's traits, whatever its Self: alloc's
    // own code (`<str as alloc::string::ToString>::to_string`,
    // `<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem`
    // and, inlined, `<T as ...SpecFromElem>::from_elem`, which
    // `vec![x; n]` runs), but for the rare user type's own impl
    // of an alloc trait (`alloc::task::Wake`), whose blocks then go
    // to its caller.
    "<* as alloc::*",
    "<* as core::alloc::global::GlobalAlloc>::*",
    "<* as core::alloc::Allocator>::*",
];

/// glib.
const GLIB: &[&str] = &[
    "g_malloc*",
    "g_realloc*",
    "g_try_malloc*",
    "g_try_realloc*",
    "g_slice_*",
    "g_strdup*",
    "g_strndup",
    "g_memdup*",
];

/// The xmalloc family: libiberty, gnulib, git.
const XMALLOC: &[&str] = &[
    "xmalloc",
    "xmallocz",
    "xmallocz_gently",
    "do_xmalloc",
    "do_xmallocz",
    "xcalloc",
    "xrealloc",
    "xzalloc",
    "xnmalloc",
    "xnrealloc",
    "x2realloc",
    "x2nrealloc",
    "xcharalloc",
    "xstrdup",
    "xstrndup",
    "xmemdup",
    "xmemdupz",
    "xasprintf",
    "xvasprintf",
    "xstrfmt",
    "xstrvfmt",
];

/// The C library allocating for its caller (strdup, asprintf,
/// getline, fopen, ...): glibc (and its dynamic loader), musl; by
/// name for static binaries.
const LIBC: &[&str] = &[
    "module:*/libc.so.6",
    "module:*/libc-*.so",
    "module:*/ld-linux-*.so*",
    "module:*/ld-musl-*.so*",
    "module:*/libc.musl-*.so*",
    // The C library's system call wrappers that make an anonymous
    // mapping (the `mmap` source), by name for static binaries.
    "mmap",
    "mmap64",
    "__mmap",
    "__mmap64",
    "mremap",
    "__mremap",
    "strdup",
    "__strdup",
    "strndup",
    "__strndup",
    "asprintf",
    "__asprintf*",
    "vasprintf",
    "__vasprintf*",
    "getline",
    "getdelim",
    "__getdelim",
    "open_memstream",
    "open_wmemstream",
    "fopen*",
    "fdopen*",
    "_IO_*",
    "realpath",
    // glibc's internal aliases, as its debug symbols name its
    // functions (__GI__IO_file_doallocate, __GI___strdup).
    "__GI_*",
];

/// CPython's memory layers (PyMem_Malloc, PyObject_Malloc, pymalloc).
const CPYTHON: &[&str] = &[
    "PyMem_*",
    "_PyMem_*",
    "PyObject_Malloc",
    "PyObject_Calloc",
    "PyObject_Realloc",
    "_PyObject_Malloc*",
    "_PyObject_Calloc*",
    "_PyObject_Realloc*",
    "pymalloc_*",
];

/// SQLite's malloc layer.
const SQLITE: &[&str] = &[
    "sqlite3MemMalloc",
    "sqlite3MemRealloc",
    "sqlite3Malloc*",
    "sqlite3_malloc*",
    "sqlite3Realloc",
    "sqlite3_realloc*",
    "sqlite3DbMalloc*",
    "sqlite3DbRealloc*",
    "sqlite3DbStrDup",
    "sqlite3DbStrNDup",
    "sqlite3DbSpanDup",
    "dbMallocRawFinish",
    "mallocWithAlarm",
];

/// OpenSSL (OPENSSL_malloc and friends are macros over these).
const OPENSSL: &[&str] = &[
    "CRYPTO_malloc",
    "CRYPTO_zalloc",
    "CRYPTO_realloc",
    "CRYPTO_clear_realloc",
    "CRYPTO_strdup",
    "CRYPTO_strndup",
    "CRYPTO_memdup",
    "CRYPTO_secure_malloc",
    "CRYPTO_secure_zalloc",
];

/// glib's aligned allocation and its string builders (g_new, g_new0
/// and g_renew are macros over g_malloc_n, g_malloc0_n, g_realloc_n).
const GLIB_STRINGS: &[&str] = &["g_aligned_alloc*", "g_strconcat", "g_strjoin*", "g_strdupv"];

/// PostgreSQL's memory contexts: palloc and friends, and the context
/// methods behind them. The methods (AllocSetAlloc, GenerationAlloc,
/// SlabAlloc, ...) are static: a stripped postgres (Debian's) names
/// them only with its debug symbols, so there a palloc'd block's
/// frame 0 is the unnamed method until the symbolizer names it. A
/// context's creation is an allocation for its creator.
const POSTGRESQL: &[&str] = &[
    "palloc",
    "palloc0",
    "palloc_*",
    "palloc0_*",
    "repalloc",
    "repalloc0",
    "repalloc_*",
    "MemoryContextAlloc*",
    "MemoryContextStrdup",
    "pstrdup",
    "pnstrdup",
    "psprintf",
    "pvsnprintf",
    "SPI_palloc",
    "SPI_repalloc",
    "AllocSetAlloc*",
    "AllocSetRealloc",
    "AllocSetContextCreate*",
    "GenerationAlloc*",
    "GenerationRealloc",
    "GenerationContextCreate",
    "SlabAlloc*",
    "SlabRealloc",
    "SlabContextCreate",
    "BumpAlloc*",
    "BumpContextCreate",
];

/// nginx: its malloc wrappers, its pools (creating one is an
/// allocation for the connection, request or module that creates
/// it) and the arrays and lists that grow in them.
const NGINX: &[&str] = &[
    "ngx_alloc",
    "ngx_calloc",
    "ngx_memalign",
    "ngx_palloc*",
    "ngx_pnalloc",
    "ngx_pcalloc",
    "ngx_pmemalign",
    "ngx_create_pool",
    "ngx_pool_cleanup_add",
    "ngx_pstrdup",
    "ngx_array_create",
    "ngx_array_push*",
    "ngx_list_create",
    "ngx_list_push",
];

/// V8: Malloced (the operator new of its C++ heap objects), its
/// malloc with retry after a GC, NewArray and StrDup, and the heap's
/// call of the embedder's ArrayBuffer allocator. Node.js: that
/// allocator (every Buffer's bytes) and its malloc wrappers.
const V8_NODE: &[&str] = &[
    "v8::internal::Malloced::operator new*",
    "v8::internal::AllocWithRetry*",
    "v8::internal::AlignedAllocWithRetry*",
    "v8::internal::AlignedAlloc*",
    "v8::internal::NewArray*",
    "v8::internal::StrDup*",
    "v8::internal::StrNDup*",
    "v8::internal::Heap::AllocateExternalBackingStore*",
    "node::NodeArrayBufferAllocator::*",
    "node::DebuggingArrayBufferAllocator::*",
    "node::UncheckedMalloc*",
    "node::UncheckedCalloc*",
    "node::UncheckedRealloc*",
    "node::Malloc*",
    "node::Calloc*",
    "node::Realloc*",
];

/// HotSpot: os::malloc and the layers over it (AllocateHeap, which
/// NEW_C_HEAP_ARRAY expands to; CHeapObj's operator new), its arenas
/// and resource areas, the growable arrays' allocators, and NMT's
/// table of allocations made before it starts.
const HOTSPOT: &[&str] = &[
    "os::malloc*",
    "os::realloc*",
    "os::strdup*",
    "AllocateHeap*",
    "ReallocateHeap*",
    "CHeapObj<*>::operator new*",
    "ResourceObj::operator new*",
    "AnyObj::operator new*",
    "Arena::grow*",
    "Arena::Amalloc*",
    "Arena::Arealloc*",
    "Chunk::operator new*",
    "ChunkPool::allocate*",
    "ResourceArea::allocate_bytes*",
    "MallocArrayAllocator<*>::*allocate*",
    "ArrayAllocator<*>::*allocate*",
    "GrowableArrayCHeapAllocator::allocate*",
    "GrowableArrayResourceAllocator::allocate*",
    "GrowableArrayArenaAllocator::allocate*",
    "GrowableArrayWithAllocator<*>::grow*",
    "GrowableArrayWithAllocator<*>::expand_to*",
    "NMTPreInit::*",
    "NMTPreInitAllocation::*",
];

/// APR (Apache httpd, ab, subversion): everything in libapr
/// allocates for its caller (its pool allocator's helpers are
/// static), and by name where APR is linked in.
const APR: &[&str] = &[
    "module:*/libapr-1.so*",
    "apr_palloc*",
    "apr_pcalloc*",
    "apr_allocator_alloc",
    "apr_pool_create*",
    "apr_pstr*dup",
    "apr_pmemdup",
    "apr_pstrcat*",
    "apr_p*sprintf",
    "apr_bucket_alloc",
];

/// talloc (Samba, sssd, ldb): likewise, by module and by name.
const TALLOC: &[&str] = &[
    "module:*/libtalloc.so*",
    "talloc_*",
    "_talloc_*",
    "__talloc*",
    "_talloc",
];
