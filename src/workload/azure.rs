//! Azure LLM inference trace loader (2023 code/conversation traces and the 2024 week-long
//! traces): CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens` (extra columns such
//! as `NumImages` are ignored). `TIMESTAMP` is a wall-clock datetime `YYYY-MM-DD hh:mm:ss`
//! with any number of fractional digits, optionally a `T` separator and a `Z`/`±hh:mm`
//! offset. Times become seconds relative to the first row, computed in integer nanoseconds
//! so 7-digit fractions survive.

use std::path::Path;

use super::error::WorkloadError;
use super::source::read_text;
use super::types::{HashIds, TimedRequest};

/// Loads an Azure CSV file (plain or gzip).
pub fn load_azure(path: &Path) -> Result<Vec<TimedRequest>, WorkloadError> {
    let text = read_text(path)?;
    parse_azure_str(&text, path)
}

/// Parses Azure CSV text; `path` only labels errors.
pub fn parse_azure_str(text: &str, path: &Path) -> Result<Vec<TimedRequest>, WorkloadError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let err = |line: usize, msg: String| WorkloadError::Parse {
        path: path.to_path_buf(),
        line,
        msg,
    };
    let Some((h_i, header)) = lines.next() else {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    };
    let cols: Vec<String> = header
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_ascii_lowercase())
        .collect();
    let find = |name: &str| {
        cols.iter()
            .position(|c| c == name)
            .ok_or_else(|| err(h_i + 1, format!("header lacks column `{name}`")))
    };
    let (c_ts, c_in, c_out) = (
        find("timestamp")?,
        find("contexttokens")?,
        find("generatedtokens")?,
    );
    let mut first_ns: Option<i64> = None;
    let mut out = Vec::new();
    for (i, line) in lines {
        let line_no = i + 1;
        let fields: Vec<&str> = line
            .split(',')
            .map(|f| f.trim().trim_matches('"'))
            .collect();
        let get = |c: usize, name: &str| {
            fields
                .get(c)
                .copied()
                .ok_or_else(|| err(line_no, format!("missing column `{name}`")))
        };
        let ts = get(c_ts, "TIMESTAMP")?;
        let ns =
            parse_datetime_ns(ts).ok_or_else(|| err(line_no, format!("bad TIMESTAMP `{ts}`")))?;
        let base = *first_ns.get_or_insert(ns);
        let count = |c: usize, name: &str| -> Result<u32, WorkloadError> {
            let s = get(c, name)?;
            s.parse::<u32>()
                .map_err(|_| err(line_no, format!("bad {name} `{s}`")))
        };
        out.push(TimedRequest {
            t: (ns - base) as f64 / 1e9,
            input_tokens: count(c_in, "ContextTokens")?,
            output_tokens: count(c_out, "GeneratedTokens")?,
            hash_ids: HashIds::default(),
            block_size: 0,
        });
    }
    if out.is_empty() {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// Nanoseconds since the Unix epoch of `YYYY-MM-DD[ T]hh:mm:ss[.f…][Z|±hh:mm]`.
pub fn parse_datetime_ns(s: &str) -> Option<i64> {
    let s = s.trim();
    let (date, rest) = s.split_at_checked(10)?;
    let rest = rest.strip_prefix([' ', 'T'])?;
    let mut d = date.split('-');
    let year: i64 = d.next()?.parse().ok()?;
    let month: u32 = d.next()?.parse().ok()?;
    let day: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // Split off a zone suffix: `Z` or a sign after the seconds.
    let (time, offset_s) = if let Some(t) = rest.strip_suffix('Z') {
        (t, 0i64)
    } else if let Some(pos) = rest.rfind(['+', '-']) {
        let (t, z) = rest.split_at(pos);
        let sign = if z.starts_with('-') { -1 } else { 1 };
        let mut hm = z[1..].split(':');
        let h: i64 = hm.next()?.parse().ok()?;
        let m: i64 = hm.next().unwrap_or("0").parse().ok()?;
        (t, sign * (h * 3600 + m * 60))
    } else {
        (rest, 0)
    };
    let (hms, frac) = match time.split_once('.') {
        Some((a, b)) => (a, b),
        None => (time, ""),
    };
    let mut t = hms.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let m: i64 = t.next()?.parse().ok()?;
    let sec: i64 = t.next()?.parse().ok()?;
    if t.next().is_some() || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut nanos: i64 = 0;
    for (i, b) in frac.bytes().enumerate() {
        if i < 9 {
            nanos = nanos * 10 + i64::from(b - b'0');
        }
    }
    for _ in frac.len()..9 {
        nanos *= 10;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + h * 3600 + m * 60 + sec - offset_s;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes_with_any_fraction_length_parse_to_the_same_instant() {
        let a = parse_datetime_ns("2023-11-16 18:15:46.6805900").unwrap();
        let b = parse_datetime_ns("2023-11-16 18:15:46.68059").unwrap();
        let c = parse_datetime_ns("2023-11-16T18:15:46.68059Z").unwrap();
        assert_eq!(a, b);
        assert_eq!(b, c);
        let whole = parse_datetime_ns("2023-11-16 18:15:46").unwrap();
        assert_eq!(a - whole, 680_590_000);
    }

    #[test]
    fn epoch_and_offsets_are_exact() {
        assert_eq!(parse_datetime_ns("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_datetime_ns("1970-01-01 01:00:00+01:00"),
            Some(0),
            "a +01:00 offset is one hour ahead of UTC"
        );
        assert_eq!(
            parse_datetime_ns("2024-03-01 00:00:00").map(|n| n / 1_000_000_000 % 86_400),
            Some(0)
        );
        assert_eq!(parse_datetime_ns("2023-13-01 00:00:00"), None);
        assert_eq!(parse_datetime_ns("2023-11-16 18:15"), None);
    }
}
