//! The small dialect layer. Products write their SQL once, in the subset
//! both databases share, with PostgreSQL's `$1` placeholders; for SQLite
//! this rewrites, outside string literals and quoted names only:
//! - `$N` to `?N` (SQLite numbers `$N` by first appearance, not by N);
//! - `FOR UPDATE` and `FOR SHARE` (with `SKIP LOCKED` or `NOWAIT`) to
//!   nothing: a SQLite write transaction already holds the database's only
//!   write lock;
//! - in schema text, `BIGSERIAL PRIMARY KEY` to `INTEGER PRIMARY KEY
//!   AUTOINCREMENT` and `BYTEA` to `BLOB`.
//!
//! What the shared subset leaves out, and the portable spelling:
//! `x::bigint` is `CAST(x AS BIGINT)` (also needed around PostgreSQL's
//! `SUM`, which is NUMERIC); `now()` is a parameter the code passes; times
//! are RFC 3339 text or integer milliseconds. Where SQL really differs,
//! the store asks [`crate::Tx::dialect`] and picks.

/// Which database a statement runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// `sqlite` on SQLite, `pg` on PostgreSQL.
    pub fn pick<'a>(self, sqlite: &'a str, pg: &'a str) -> &'a str {
        match self {
            Dialect::Sqlite => sqlite,
            Dialect::Postgres => pg,
        }
    }
}

/// A statement's text for SQLite.
pub fn sqlite_sql(sql: &str) -> String {
    rewrite(sql, false)
}

/// Schema text (a migration) for SQLite.
pub fn sqlite_schema(sql: &str) -> String {
    rewrite(sql, true)
}

fn rewrite(sql: &str, schema: bool) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\'' || c == b'"' {
            // Copy a quoted literal or name whole ('' and "" escape).
            let start = i;
            i += 1;
            while i < b.len() {
                if b[i] == c {
                    if b.get(i + 1) == Some(&c) {
                        i += 2;
                        continue;
                    }
                    break;
                }
                i += 1;
            }
            i = (i + 1).min(b.len());
            out.push_str(&sql[start..i]);
            continue;
        }
        if c == b'-' && b.get(i + 1) == Some(&b'-') {
            // A line comment, copied up to its newline.
            let end = sql[i..].find('\n').map_or(b.len(), |n| i + n);
            out.push_str(&sql[i..end]);
            i = end;
            continue;
        }
        if c == b'$' && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            out.push('?');
            i += 1;
            continue;
        }
        let word_start = i == 0 || !is_word(b[i - 1]);
        if word_start && c.is_ascii_alphabetic() {
            let lock = keywords(&sql[i..], &["FOR", "UPDATE"])
                .or_else(|| keywords(&sql[i..], &["FOR", "SHARE"]));
            if let Some(n) = lock {
                let mut end = i + n;
                for tail in [&["SKIP", "LOCKED"][..], &["NOWAIT"][..]] {
                    if let Some(m) = keywords(&sql[end..], tail) {
                        end += m;
                        break;
                    }
                }
                out.truncate(out.trim_end().len());
                i = end;
                continue;
            }
            if schema {
                if let Some(n) = keywords(&sql[i..], &["BIGSERIAL", "PRIMARY", "KEY"]) {
                    out.push_str("INTEGER PRIMARY KEY AUTOINCREMENT");
                    i += n;
                    continue;
                }
                if let Some(n) = keywords(&sql[i..], &["BYTEA"]) {
                    out.push_str("BLOB");
                    i += n;
                    continue;
                }
            }
        }
        let ch = sql[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// If `s` starts (after whitespace, for all but the first) with the
/// words, case-insensitive and each ending at a word boundary: how many
/// bytes they span, leading whitespace included.
fn keywords(s: &str, words: &[&str]) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    for w in words {
        let ws = b[i..]
            .iter()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
        i += ws;
        let end = i + w.len();
        if end > b.len() || !s[i..end].eq_ignore_ascii_case(w) {
            return None;
        }
        if b.get(end).is_some_and(|c| is_word(*c)) {
            return None;
        }
        i = end;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_numbered_outside_literals() {
        assert_eq!(
            sqlite_sql("SELECT a FROM t WHERE b = $2 AND c = '$1' AND \"$3\" = $1"),
            "SELECT a FROM t WHERE b = ?2 AND c = '$1' AND \"$3\" = ?1"
        );
        assert_eq!(
            sqlite_sql("SELECT 'it''s $1', $10"),
            "SELECT 'it''s $1', ?10"
        );
        assert_eq!(
            sqlite_sql("SELECT 1 -- costs $1\n, $1"),
            "SELECT 1 -- costs $1\n, ?1"
        );
    }

    #[test]
    fn row_locks_are_dropped_for_sqlite() {
        assert_eq!(
            sqlite_sql("SELECT x FROM t WHERE id = $1 FOR UPDATE"),
            "SELECT x FROM t WHERE id = ?1"
        );
        assert_eq!(
            sqlite_sql("SELECT x FROM t for  update skip locked LIMIT 1"),
            "SELECT x FROM t LIMIT 1"
        );
        assert_eq!(
            sqlite_sql("SELECT for_update FROM t"),
            "SELECT for_update FROM t"
        );
        assert_eq!(sqlite_sql("SELECT 'FOR UPDATE'"), "SELECT 'FOR UPDATE'");
    }

    #[test]
    fn schema_types_are_spelled_for_sqlite() {
        assert_eq!(
            sqlite_schema("CREATE TABLE t (seq BIGSERIAL PRIMARY KEY, b BYTEA, c bytea_x)"),
            "CREATE TABLE t (seq INTEGER PRIMARY KEY AUTOINCREMENT, b BLOB, c bytea_x)"
        );
        // Statements are not schema: a column named like a type stays.
        assert_eq!(sqlite_sql("SELECT bytea FROM t"), "SELECT bytea FROM t");
    }
}
