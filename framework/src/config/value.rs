//! The text form of a setting's value, as `TENURE_*` variables and CLI flags
//! carry it: durations in human form (`5s`, `250ms`, `1h30m`), `none` for an
//! unset optional, comma lists, `true`/`false`.

use std::path::PathBuf;
use std::time::Duration;

use super::WatchdogPolicy;
use crate::security::Secret;

/// A value a setting holds: how to read it from text and show it.
pub(super) trait Value: Sized {
    /// What the text must look like, for the configuration reference.
    const KIND: &'static str;
    /// Reads `text` (already trimmed, never empty).
    fn parse(text: &str) -> Result<Self, String>;
    /// The text form [`parse`](Value::parse) reads back.
    fn show(&self) -> String;
}

/// The units a duration may carry, largest first.
const UNITS: [(&str, Duration); 6] = [
    ("d", Duration::from_secs(86_400)),
    ("h", Duration::from_secs(3_600)),
    ("m", Duration::from_secs(60)),
    ("s", Duration::from_secs(1)),
    ("ms", Duration::from_millis(1)),
    ("us", Duration::from_micros(1)),
];

/// Reads a duration in human form: whole numbers, each with a unit (`d`, `h`,
/// `m`, `s`, `ms`, `us`), one after another: `5s`, `250ms`, `1h30m`. A bare
/// number is refused: its unit would be a guess.
///
/// ```
/// use std::time::Duration;
/// use tenure::config::parse_duration;
/// assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert!(parse_duration("5").is_err());
/// ```
///
/// # Errors
/// Text that is not such a duration, with the reason.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_len = rest[digits..]
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len() - digits);
        let (number, unit) = (&rest[..digits], &rest[digits..digits + unit_len]);
        let n: u32 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration like 5s, 250ms or 1h30m"))?;
        let size = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, size)| *size)
            .ok_or_else(|| format!("{text:?}: unit {unit:?} is none of d, h, m, s, ms, us"))?;
        total = total
            .checked_add(size * n)
            .ok_or_else(|| format!("{text:?} is too long"))?;
        rest = &rest[digits + unit_len..];
    }
    Ok(total)
}

/// Shows a duration in the largest unit that divides it: `5s`, `250ms`,
/// `90m`; what [`parse_duration`] reads back.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tenure::config::format_duration(Duration::from_millis(1500)), "1500ms");
/// ```
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    for (name, size) in UNITS {
        if d.as_nanos().is_multiple_of(size.as_nanos()) {
            return format!("{}{name}", d.as_nanos() / size.as_nanos());
        }
    }
    format!("{}us", d.as_micros())
}

impl Value for Duration {
    const KIND: &'static str = "duration";
    fn parse(text: &str) -> Result<Self, String> {
        parse_duration(text)
    }
    fn show(&self) -> String {
        format_duration(*self)
    }
}

/// `none` (any case) for an unset optional; anything else is the value.
fn optional<T: Value>(text: &str) -> Result<Option<T>, String> {
    if text.eq_ignore_ascii_case("none") {
        Ok(None)
    } else {
        T::parse(text).map(Some)
    }
}

fn show_optional<T: Value>(value: &Option<T>) -> String {
    value.as_ref().map_or_else(|| "none".into(), Value::show)
}

impl Value for Option<Duration> {
    const KIND: &'static str = "duration or `none`";
    fn parse(text: &str) -> Result<Self, String> {
        optional(text)
    }
    fn show(&self) -> String {
        show_optional(self)
    }
}

impl Value for Option<u32> {
    const KIND: &'static str = "number or `none`";
    fn parse(text: &str) -> Result<Self, String> {
        optional(text)
    }
    fn show(&self) -> String {
        show_optional(self)
    }
}

macro_rules! number {
    ($($t:ty),*) => {$(
        impl Value for $t {
            const KIND: &'static str = "number";
            fn parse(text: &str) -> Result<Self, String> {
                text.parse().map_err(|e| format!("{text:?}: {e}"))
            }
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
number!(u32, u64, usize, i64);

impl Value for bool {
    const KIND: &'static str = "`true` or `false`";
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(format!("{other:?} is not true or false")),
        }
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl Value for String {
    const KIND: &'static str = "text";
    fn parse(text: &str) -> Result<Self, String> {
        Ok(text.to_string())
    }
    fn show(&self) -> String {
        self.clone()
    }
}

impl Value for Vec<String> {
    const KIND: &'static str = "comma-separated list";
    fn parse(text: &str) -> Result<Self, String> {
        Ok(text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect())
    }
    fn show(&self) -> String {
        self.join(",")
    }
}

impl Value for Option<String> {
    const KIND: &'static str = "text";
    fn parse(text: &str) -> Result<Self, String> {
        Ok(Some(text.to_string()))
    }
    fn show(&self) -> String {
        self.clone().unwrap_or_default()
    }
}

impl Value for Option<Secret> {
    const KIND: &'static str = "secret";
    fn parse(text: &str) -> Result<Self, String> {
        Ok(Some(Secret::new(text)))
    }
    fn show(&self) -> String {
        self.as_ref().map(|_| "***".into()).unwrap_or_default()
    }
}

impl Value for Option<PathBuf> {
    const KIND: &'static str = "file path";
    fn parse(text: &str) -> Result<Self, String> {
        Ok(Some(text.into()))
    }
    fn show(&self) -> String {
        self.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }
}

impl Value for WatchdogPolicy {
    const KIND: &'static str = "`cancel_jobs` or `abort_process`";
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "cancel_jobs" => Ok(WatchdogPolicy::CancelJobs),
            "abort_process" => Ok(WatchdogPolicy::AbortProcess),
            other => Err(format!("{other:?} is not cancel_jobs or abort_process")),
        }
    }
    fn show(&self) -> String {
        match self {
            WatchdogPolicy::CancelJobs => "cancel_jobs",
            WatchdogPolicy::AbortProcess => "abort_process",
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_human_form_and_show_back() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("5s", ms(5000)),
            ("250ms", ms(250)),
            ("1h30m", ms(5_400_000)),
            ("30d", ms(30 * 86_400_000)),
            ("1s500ms", ms(1500)),
            ("0s", Duration::ZERO),
            ("750us", Duration::from_micros(750)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
            assert_eq!(parse_duration(&format_duration(want)), Ok(want), "{text}");
        }
        assert_eq!(format_duration(ms(5000)), "5s");
        assert_eq!(format_duration(ms(5_400_000)), "90m");
        for bad in [
            "",
            "5",
            "s",
            "5 s",
            "-1s",
            "1.5s",
            "5sec",
            "1y",
            "99999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn optionals_take_none_and_booleans_two_spellings() {
        assert_eq!(<Option<Duration>>::parse("none"), Ok(None));
        assert_eq!(<Option<Duration>>::parse("NONE"), Ok(None));
        assert_eq!(<Option<u32>>::parse("8"), Ok(Some(8)));
        assert_eq!(Some(8u32).show(), "8");
        assert_eq!(bool::parse("1"), Ok(true));
        assert!(bool::parse("yes").is_err());
        assert!(u32::parse("-1").is_err());
        assert_eq!(
            <Vec<String>>::parse("a, b,,c"),
            Ok(vec!["a".into(), "b".into(), "c".into()])
        );
        assert_eq!(Some(Secret::new("pw")).show(), "***");
        let policy = WatchdogPolicy::AbortProcess;
        assert_eq!(WatchdogPolicy::parse(&policy.show()), Ok(policy));
    }
}
