//! Slurm hostlist expansion (`SLURM_NODELIST`, `SLURM_JOB_NODELIST`): `node[01-04,07]`,
//! `gpu[1-2]-ib,login`, `rack[1-2]-n[01-02]` (several bracket groups multiply out). Zero padding
//! of the lower bound is kept (`[08-10]` gives `08 09 10`). Only the first host is needed to find
//! the master, but the whole list is expanded so that a malformed list fails loudly.

use crate::error::{DistError, Result};

/// Upper bound on the number of hosts one expression may expand to (guards against typos such
/// as `node[1-100000000]`).
pub const MAX_HOSTS: usize = 1 << 20;

/// Expand a Slurm hostlist expression into host names, in order.
pub fn expand(expr: &str) -> Result<Vec<String>> {
    let bad = |reason: &str| DistError::BadHostlist {
        expr: expr.to_string(),
        reason: reason.to_string(),
    };
    let expr_trim = expr.trim();
    if expr_trim.is_empty() {
        return Err(bad("empty host list"));
    }
    let mut hosts = Vec::new();
    for item in split_top_level(expr_trim).map_err(|r| bad(&r))? {
        if item.is_empty() {
            return Err(bad("empty entry between commas"));
        }
        expand_item(&item, &mut hosts).map_err(|r| bad(&r))?;
        if hosts.len() > MAX_HOSTS {
            return Err(bad(&format!("expands to more than {MAX_HOSTS} hosts")));
        }
    }
    Ok(hosts)
}

/// First host of a hostlist expression (what Slurm launchers use as `MASTER_ADDR`).
pub fn first_host(expr: &str) -> Result<String> {
    // Expanding everything validates the whole list; lists are small (one entry per node).
    Ok(expand(expr)?.swap_remove(0))
}

/// Split on commas that are not inside brackets.
fn split_top_level(s: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err("nested '[' is not allowed".into());
                }
                depth += 1;
                cur.push(c);
            }
            ']' => {
                if depth == 0 {
                    return Err("']' without a matching '['".into());
                }
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            c if c.is_whitespace() => return Err("whitespace inside a host list".into()),
            _ => cur.push(c),
        }
    }
    if depth != 0 {
        return Err("'[' without a matching ']'".into());
    }
    out.push(cur);
    Ok(out)
}

/// Expand one entry (`prefix[ranges]suffix[ranges]...`) into `out`.
fn expand_item(item: &str, out: &mut Vec<String>) -> std::result::Result<(), String> {
    let mut partial: Vec<String> = vec![String::new()];
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| c + open)
            .ok_or("'[' without ']'")?;
        let literal = &rest[..open];
        let choices = expand_ranges(&rest[open + 1..close])?;
        let mut next = Vec::with_capacity(partial.len() * choices.len());
        for p in &partial {
            for c in &choices {
                next.push(format!("{p}{literal}{c}"));
            }
        }
        if next.len() > MAX_HOSTS {
            return Err(format!("expands to more than {MAX_HOSTS} hosts"));
        }
        partial = next;
        rest = &rest[close + 1..];
    }
    for p in partial {
        out.push(format!("{p}{rest}"));
    }
    Ok(())
}

/// Expand the inside of one bracket: `01-04,07`.
fn expand_ranges(body: &str) -> std::result::Result<Vec<String>, String> {
    if body.is_empty() {
        return Err("empty brackets".into());
    }
    let mut out = Vec::new();
    for part in body.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (part, part),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!(
                "bracket range {part:?} is not N or N-M with decimal N, M"
            ));
        }
        let width = lo.len();
        let a: u64 = lo.parse().map_err(|_| format!("number {lo:?} too large"))?;
        let b: u64 = hi.parse().map_err(|_| format!("number {hi:?} too large"))?;
        if b < a {
            return Err(format!("descending range {part:?}"));
        }
        if (b - a) as usize >= MAX_HOSTS {
            return Err(format!("range {part:?} expands to more than {MAX_HOSTS} hosts"));
        }
        for n in a..=b {
            out.push(format!("{n:0width$}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_ranges() {
        assert_eq!(expand("node1").unwrap(), ["node1"]);
        assert_eq!(
            expand("node[01-04,07]").unwrap(),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(expand("a[8-10]").unwrap(), ["a8", "a9", "a10"]);
        assert_eq!(expand("a[08-10]").unwrap(), ["a08", "a09", "a10"]);
        assert_eq!(
            expand("gpu[1-2]-ib,login").unwrap(),
            ["gpu1-ib", "gpu2-ib", "login"]
        );
        assert_eq!(
            expand("r[1-2]n[01-02]").unwrap(),
            ["r1n01", "r1n02", "r2n01", "r2n02"]
        );
        assert_eq!(expand("x[3],y[5-6]").unwrap(), ["x3", "y5", "y6"]);
        assert_eq!(first_host("node[07-09],other").unwrap(), "node07");
    }

    #[test]
    fn malformed_lists_are_errors() {
        for bad in [
            "",
            "node[1-",
            "node1-2]",
            "node[]",
            "node[a-b]",
            "node[5-3]",
            "n[1-2],,m",
            "n[[1]]",
            "a b",
        ] {
            let err = expand(bad).unwrap_err();
            assert!(matches!(err, DistError::BadHostlist { .. }), "{bad:?}: {err}");
        }
        assert!(expand("n[0-99999999999]").is_err());
    }
}
