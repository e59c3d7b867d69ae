//! The index's numbering, orders, representatives and hints.

use super::*;
use crate::FrameExtra;
use crate::testing::trace;
use crate::trace::Trace;

fn tb(frames: &[(&str, u32)], total: Option<u32>) -> Arc<Traceback> {
    Arc::new(Traceback::new(
        frames.iter().map(|&(f, l)| Frame::new(f, l)).collect(),
        total,
    ))
}

/// The frames of traceback `t` of `index`, oldest first, as text.
fn frames_of(index: &Index, t: usize) -> Vec<String> {
    index
        .tb_frames(t)
        .iter()
        .map(|&f| {
            let name = index.name(index.frame_name(f as usize)).unwrap();
            format!("{name}:{}", index.frame_lineno[f as usize])
        })
        .collect()
}

#[test]
fn interning_from_a_loader_is_checked_and_subsets_renumber() {
    let a = tb(&[("a.c", 1)], None);
    let b = tb(&[("b.c", 2)], None);
    let traces = [trace(1, &a), trace(2, &b), trace(4, &a)];
    let good = Interned::checked(&traces, vec![Arc::clone(&a), Arc::clone(&b)], vec![0, 1, 0]);
    assert_eq!(good.as_ref().map(Interned::ids), Some(&[0, 1, 0][..]));
    // Not in order of first appearance, another Arc, unused, short.
    assert!(
        Interned::checked(&traces, vec![Arc::clone(&b), Arc::clone(&a)], vec![1, 0, 1]).is_none()
    );
    let copy = tb(&[("a.c", 1)], None);
    assert!(Interned::checked(&traces, vec![copy, Arc::clone(&b)], vec![0, 1, 0]).is_none());
    assert!(
        Interned::checked(
            &traces,
            vec![Arc::clone(&a), Arc::clone(&b), Arc::clone(&b)],
            vec![0, 1, 0]
        )
        .is_none()
    );
    assert!(Interned::checked(&traces, vec![Arc::clone(&a), Arc::clone(&b)], vec![0, 1]).is_none());
    let (subset, parents) = Interned::of(&traces).subset(&[false, true, true]);
    assert_eq!(subset.ids(), [0, 1]);
    assert_eq!(subset.len(), 2);
    assert_eq!(parents, [1, 0]);
}

#[test]
fn ids_follow_tracemalloc_orders_and_equal_frames_are_one_traceback() {
    // Most recent first; tracemalloc orders tracebacks oldest first.
    let x = tb(&[("b.c", 2), ("main.c", 9)], Some(7));
    let y = tb(&[("a.c", 5), ("main.c", 9)], None);
    let z = tb(&[("main.c", 9)], None);
    let x_copy = tb(&[("b.c", 2), ("main.c", 9)], None);
    let w = tb(&[("a.c", 10), ("a.c", 5)], None);
    let traces = [
        trace(1, &x),
        trace(1, &y),
        trace(1, &x_copy),
        trace(1, &z),
        trace(1, &w),
    ];
    let index = Index::build(Interned::of(&traces), None);
    assert_eq!(index.files(), 3);
    assert_eq!(
        (0..index.files() as u32)
            .map(|f| index.file(f).unwrap().to_string())
            .collect::<Vec<_>>(),
        ["a.c", "b.c", "main.c"]
    );
    assert_eq!(index.frame_lineno, [5, 10, 2, 9]);
    assert_eq!(index.tracebacks(), 4);
    let all: Vec<Vec<String>> = (0..4).map(|t| frames_of(&index, t)).collect();
    assert_eq!(
        all,
        [
            vec!["a.c:5", "a.c:10"],
            vec!["main.c:9"],
            vec!["main.c:9", "a.c:5"],
            vec!["main.c:9", "b.c:2"],
        ]
    );
    // x and its copy are one traceback, shown by x without its
    // total_nframe.
    assert_eq!(index.arc_tb, [3, 2, 3, 1, 0]);
    assert!(index.tb_views[3].total_nframe().is_none());
    assert_eq!(index.tb_top, [1, 3, 0, 2]);
}

#[test]
fn representatives_are_the_first_occurrences() {
    let at = |address| FrameExtra {
        function: None,
        module: None,
        address: Some(address),
        build_id: None,
    };
    let frame = |file: &str, line, address| Frame::new(file, line).with_extra(at(address));
    // a.c:1 first appears below the top (address 1), then on top (2).
    let one = Arc::new(Traceback::new(
        vec![frame("b.c", 1, 0), frame("a.c", 1, 1)],
        None,
    ));
    let two = Arc::new(Traceback::new(vec![frame("a.c", 1, 2)], None));
    let three = Arc::new(Traceback::new(vec![frame("a.c", 1, 3)], None));
    let traces = [trace(1, &one), trace(1, &two), trace(1, &three)];
    let index = Index::build(Interned::of(&traces), None);
    let address =
        |frames: &Arc<[Frame]>, f: usize| frames[f].extra.as_ref().and_then(|e| e.address);
    // Frame 0 is a.c:1, frame 1 b.c:1.
    assert_eq!(address(&index.first_frames, 0), Some(1));
    assert_eq!(address(&index.top_frames, 0), Some(2));
    assert_eq!(address(&index.first_frames, 1), Some(0));
    assert_eq!(address(&index.top_frames, 1), Some(0));
    assert_eq!(
        index.frame_hash[0],
        Traceback::one_frame_hash(&Frame::new("a.c", 1))
    );
}

#[test]
fn hints_give_the_index_built_without_them() {
    let names: Vec<Arc<str>> = (0..7).map(|i| Arc::from(format!("f{i}.c"))).collect();
    let mut random = crate::testing::lcg(99);
    let mut next = move |n: u64| (random() >> 33) % n;
    let pool: Vec<Arc<Traceback>> = (0..300)
        .map(|_| {
            let depth = 1 + next(5) as usize;
            let frames = (0..depth)
                .map(|_| Frame::new(Arc::clone(&names[next(7) as usize]), next(4) as u32))
                .collect();
            Arc::new(Traceback::new(frames, None))
        })
        .collect();
    let traces: Vec<Trace> = (0..2000)
        .map(|_| trace(next(100), &pool[next(300) as usize]))
        .collect();
    let plain = Index::build(Interned::of(&traces), None);
    let arcs = plain.interned.len() as u32;
    let keep: Vec<u32> = (0..arcs).collect();
    let hinted = Index::build(Interned::of(&traces), Some(plain.hints_for(&keep)));
    let same = |a: &Index, b: &Index| {
        assert_eq!(a.arc_tb, b.arc_tb);
        assert_eq!(a.tb_start, b.tb_start);
        assert_eq!(a.tb_frames, b.tb_frames);
        assert_eq!(a.tb_top, b.tb_top);
        assert_eq!(a.frame_file, b.frame_file);
        assert_eq!(a.frame_lineno, b.frame_lineno);
        assert_eq!(a.frame_hash, b.frame_hash);
        assert_eq!(a.file_hash, b.file_hash);
    };
    same(&plain, &hinted);
    // A subset, as filter_traces makes it: its own index from hints.
    let kept: Vec<bool> = (0..traces.len()).map(|i| i % 3 != 1).collect();
    let subset: Vec<Trace> = traces
        .iter()
        .zip(&kept)
        .filter(|(_, k)| **k)
        .map(|(t, _)| t.clone())
        .collect();
    let (interned, parents) = plain.interned.subset(&kept);
    same(
        &Index::build(Interned::of(&subset), None),
        &Index::build(interned, Some(plain.hints_for(&parents))),
    );
    // Hints that do not fit are ignored.
    let mut short = plain.hints_for(&keep);
    short.spans.pop();
    same(&plain, &Index::build(Interned::of(&traces), Some(short)));
    let mut wrong = plain.hints_for(&keep);
    wrong.count = 1;
    same(&plain, &Index::build(Interned::of(&traces), Some(wrong)));
    let mut long = plain.hints_for(&keep);
    if let Some(span) = long.spans.first_mut() {
        span.1 += 1;
    }
    same(&plain, &Index::build(Interned::of(&traces), Some(long)));
}

#[test]
fn sequences_sort_past_their_packed_prefixes() {
    // Three frames: 3 bits a symbol, 32 symbols a packed prefix.
    let mut sequences: Vec<Vec<u32>> = vec![
        vec![1; 60],
        [vec![1; 50], vec![0]].concat(),
        vec![1; 48],
        [vec![1; 48], vec![2, 0]].concat(),
        vec![0, 2],
        vec![2],
        [vec![1; 50], vec![0, 0]].concat(),
    ];
    let order = sort_sequences(sequences.len(), 3, |t| &sequences[t as usize]);
    let sorted: Vec<Vec<u32>> = order
        .iter()
        .map(|&t| sequences[t as usize].clone())
        .collect();
    sequences.sort();
    assert_eq!(sorted, sequences);
}

#[test]
fn frames_with_sites_are_ordered_by_name_and_filed_under_their_module() {
    let site = |file: &str, function, offset| Frame::without_line(file, function, offset);
    let module_line = Frame::new("/bin/app", 0);
    let frames = [
        site("/lib/x.so", Some("g"), 1),
        site("/bin/app", None, 0x10),
        Frame::new("/bin/app.c", 3),
        site("/bin/app", Some("f"), 0x20),
        module_line.clone(),
    ];
    let traces: Vec<Trace> = frames
        .iter()
        .map(|frame| trace(1, &Arc::new(Traceback::new(vec![frame.clone()], None))))
        .collect();
    let index = Index::build(Interned::of(&traces), None);
    let names: Vec<String> = (0..index.names() as u32)
        .map(|n| index.name(n).unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "/bin/app",
            "/bin/app!f+0x20",
            "/bin/app+0x10",
            "/bin/app.c",
            "/lib/x.so!g+0x1"
        ]
    );
    let files: Vec<String> = (0..index.files() as u32)
        .map(|f| index.file(f).unwrap().to_string())
        .collect();
    assert_eq!(files, ["/bin/app", "/bin/app.c", "/lib/x.so"]);
    // Frames in name order, each filed under its module.
    assert_eq!(index.frame_file, [0, 0, 0, 1, 2]);
    assert_eq!(
        (0..5).map(|f| index.frame_name(f)).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    // The module's file shares the text of the frame named by it.
    assert!(Arc::ptr_eq(
        index.file(0).unwrap(),
        &index.first_frames[0].filename
    ));
    // Without a site, names are the files: no second table.
    let plain = [trace(1, &tb(&[("a.c", 1), ("b.c", 2)], None))];
    assert!(Index::build(Interned::of(&plain), None).names.is_none());
}
