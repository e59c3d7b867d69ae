//! `format=collapsed` and `format=svg`: statistics or a compare as folded
//! stacks (what flamegraph.pl, inferno and speedscope read) and as a flame
//! graph drawn by inferno.
//!
//! Folded stacks: one line per statistic, `root;...;leaf VALUE`, frames
//! oldest first (each named by [`Node::folded_name`]), the value the
//! group's bytes; groups of 0 bytes are left out. A compare writes the
//! differential form, two values per line, `root;...;leaf BASE NEW` (the
//! group's bytes in the base and in the new side), as flamegraph's
//! `difffolded.pl` writes it and inferno's flame graph reads it (red grew,
//! blue shrank); groups of 0 bytes on both sides are left out.
use inferno::flamegraph::{self, Options};

use super::stacks::{Node, Row};

/// The folded stack of a row: oldest frame first, `;` between frames.
fn stack(row: &Row<'_>) -> String {
    let names: Vec<String> = row.frames.iter().rev().map(Node::folded_name).collect();
    names.join(";")
}

/// The folded lines of statistics (`diff` false) or of a compare (`diff`
/// true: `BASE NEW` per line), each ending in `\n`.
#[must_use]
pub fn collapsed(rows: &[Row<'_>], diff: bool) -> String {
    let mut out = String::new();
    for row in rows {
        let line = if diff {
            let base = row.base_size();
            if base == 0 && row.size == 0 {
                continue;
            }
            format!("{} {base} {}\n", stack(row), row.size)
        } else {
            if row.size == 0 {
                continue;
            }
            format!("{} {}\n", stack(row), row.size)
        };
        out.push_str(&line);
    }
    out
}

/// The flame graph of `folded` (the output of [`collapsed`]) as SVG, titled
/// `title`; a differential one when `folded` has two values per line. With
/// no stack at all, an SVG that says so.
///
/// # Errors
/// What inferno reports (writing into memory: never in practice).
pub fn svg(folded: &str, title: &str) -> std::io::Result<Vec<u8>> {
    if folded.is_empty() {
        return Ok(empty_svg(title).into_bytes());
    }
    let mut options = Options::default();
    options.title = title.to_string();
    options.count_name = "bytes".to_string();
    options.name_type = "Frame:".to_string();
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, folded.lines(), &mut out)?;
    Ok(out)
}

/// An SVG with `title` and a line saying there is nothing to draw.
fn empty_svg(title: &str) -> String {
    let escape = |text: &str| {
        text.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"80\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-size=\"17\">{}</text>\n\
         <text x=\"600\" y=\"56\" text-anchor=\"middle\" font-size=\"12\">no live block: nothing to draw</text>\n\
         </svg>\n",
        escape(title)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    fn node<'a>(function: Option<&'a str>, file: &'a str, line: u32) -> Node<'a> {
        Node::of(function, file, line, None)
    }

    fn rows() -> Vec<Row<'static>> {
        vec![
            Row {
                frames: vec![
                    node(Some("alloc;a"), "a.c", 9),
                    node(Some("main"), "a.c", 30),
                ],
                count: 3,
                size: 300,
                count_diff: 1,
                size_diff: 100,
            },
            Row {
                frames: vec![node(None, "/lib/libc.so.6", 0), node(None, "b.c", 4)],
                count: 0,
                size: 0,
                count_diff: -1,
                size_diff: -7,
            },
        ]
    }

    #[test]
    fn collapsed_is_root_first_in_bytes() {
        assert_eq!(
            collapsed(&rows(), false),
            "main (a.c:30);alloc:a (a.c:9) 300\n"
        );
        assert_eq!(
            collapsed(&rows(), true),
            "main (a.c:30);alloc:a (a.c:9) 200 300\nb.c:4;/lib/libc.so.6 7 0\n"
        );
    }

    #[test]
    fn svg_draws_the_frames_and_the_title() {
        let drawn =
            String::from_utf8(svg(&collapsed(&rows(), true), "tracer: pid 7").unwrap()).unwrap();
        assert!(drawn.contains("tracer: pid 7"), "{drawn}");
        assert!(drawn.contains("alloc:a (a.c:9)"), "{drawn}");
        let empty = String::from_utf8(svg("", "tracer: pid <7>").unwrap()).unwrap();
        assert!(empty.contains("tracer: pid &lt;7&gt;"), "{empty}");
    }
}
