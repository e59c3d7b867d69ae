//! Globs, C++ return types, and the two kinds of pattern.
use super::*;

fn glob(g: &str) -> Glob {
    Glob::new(g).unwrap()
}

#[test]
fn globs_match_stars_question_marks_and_literal_brackets() {
    assert!(glob("operator new*").matches("operator new[](unsigned long)"));
    assert!(glob("<[*]>::*").matches("<[u8]>::to_vec"));
    assert!(!glob("<[*]>::*").matches("<u8>::to_vec"));
    assert!(glob("g_malloc?").matches("g_malloc0"));
    assert!(!glob("g_malloc?").matches("g_malloc"));
    assert!(glob("a*b*c").matches("aXbYc"));
    assert!(glob("*").matches(""));
    assert!(!glob("xmalloc").matches("xmallocz"));
    assert!(glob(r"a\*b").matches("a*b"));
    assert!(!glob(r"a\*b").matches("aXb"));
    assert!(glob(r"a\?\\").matches(r"a?\"));
    // Brackets are themselves, never a class.
    assert!(glob("x[!a]").matches("x[!a]"));
    assert!(!glob("x[!a]").matches("xb"));
    assert!(glob("operator new[]*").matches("operator new[](unsigned long)"));
    assert!(!glob("operator new[]*").matches("operator new(unsigned long)"));
    assert!(glob("*/libc.so.6").matches("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    assert!(!glob("*/libc.so.6").matches("/usr/lib/x86_64-linux-gnu/libc.so.60"));
}

#[test]
fn return_types_of_cpp_templates_are_found() {
    let cases = [
        (
            "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)",
            Some(
                "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)",
            ),
        ),
        ("unsigned long std::foo<int>()", Some("std::foo<int>()")),
        (
            "std::_MakeUniq<int>::__single_object std::make_unique<int>()",
            Some("std::make_unique<int>()"),
        ),
        ("operator new(unsigned long)", None),
        ("operator new[](unsigned long, std::align_val_t)", None),
        (
            "bool std::operator< <char>(std::string const&, char const*)",
            Some("std::operator< <char>(std::string const&, char const*)"),
        ),
        (
            "std::foo::operator std::vector<int, std::allocator<int> >() const",
            None,
        ),
        ("main::{lambda(int)#1}::operator()(int) const", None),
        ("(anonymous namespace)::grow(int)", None),
        ("myapp::f(int, std::string)", None),
        (
            "<alloc::alloc::Global as core::alloc::Allocator>::allocate",
            None,
        ),
        ("xmalloc", None),
    ];
    for (name, want) in cases {
        assert_eq!(without_return_type(name), want, "{name}");
    }
}

#[test]
fn function_and_module_patterns_are_apart() {
    let p = FramePatterns::compile(&["std::*".into(), "module:*/libc.so.6".into()]).unwrap();
    assert!(p.matches_function("std::__new_allocator<int>::allocate(unsigned long, void const*)"));
    assert!(p.matches_function("int* std::__uninitialized_copy_a<int const*, int*, int>(int const*, int const*, int*, std::allocator<int>&)"));
    // A user function with std:: in its parameters is the user's.
    assert!(!p.matches_function("myapp::f(int, std::string)"));
    assert!(!p.matches_function("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    assert!(p.matches_module("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    assert!(!p.matches_module("std::x"));
    assert!(!p.is_empty());
    assert!(FramePatterns::compile(&[]).unwrap().is_empty());
}

#[test]
fn a_pattern_that_does_not_parse_is_refused_as_the_configuration_refuses_it() {
    let patterns = ["xmalloc".to_string(), r"my\alloc".to_string()];
    let err = FramePatterns::compile(&patterns).unwrap_err();
    assert_eq!(
        err.to_string(),
        parse_frame_patterns(&patterns).unwrap_err().to_string()
    );
    assert!(
        err.to_string()
            .starts_with(r#"allocator_frames = "my\\alloc" is invalid: \a: a backslash"#),
        "{err}"
    );
}
