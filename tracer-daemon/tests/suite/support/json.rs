//! Reading the API's answers: numbers in JSON, the statistic of a line, and
//! samples of a Prometheus (OpenMetrics) exposition.

use std::path::Path;

use serde_json::Value;

/// The whole number `value[field]`; fails the test when it is not one.
pub fn u64_of(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

/// Finds the statistic (JSON object) whose first frame is `file:line`.
pub fn stat_at<'a>(stats: &'a Value, file: &Path, line: u32) -> Option<&'a Value> {
    stats.as_array()?.iter().find(|s| {
        let frame = &s["traceback"][0];
        frame["filename"].as_str() == file.to_str()
            && frame["lineno"].as_u64() == Some(u64::from(line))
    })
}

/// The ids of a `GET /snapshots` listing, in its order.
pub fn snapshot_ids(list: &Value) -> Vec<u64> {
    list["snapshots"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["id"].as_u64())
        .collect()
}

/// The value of the first sample `name{labels...}` whose labels include all
/// of `want`, from Prometheus or OpenMetrics text.
pub fn sample(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let ok = want
            .iter()
            .all(|(k, v)| labels.split(',').any(|pair| pair == format!("{k}=\"{v}\"")));
        if ok { value.trim().parse().ok() } else { None }
    })
}
