//! A struct that is one table's row, its columns named once. A store
//! otherwise writes every column three times (the struct, the INSERT with
//! its arguments, the mapping of a read row) and the three drift apart;
//! [`record!`](crate::record) declares the struct with its table, and
//! [`Tx::insert`](crate::Tx::insert) and [`Record::from_row`] write and
//! read it by its field names.

use crate::{DbError, FromValue, Row, Value};
use std::collections::BTreeMap;

/// One table's row: each field is the column of the same name.
pub trait Record: Sized {
    const TABLE: &'static str;
    const COLUMNS: &'static [&'static str];
    /// The fields as parameters, in [`Record::COLUMNS`] order.
    fn values(&self) -> Result<Vec<Value>, DbError>;
    /// A row read by column name (`SELECT *` or any superset).
    fn from_row(r: &Row) -> Result<Self, DbError>;

    /// `INSERT INTO <table> (<columns>) VALUES ($1, ...)`.
    fn insert_sql() -> String {
        let marks: Vec<String> = (1..=Self::COLUMNS.len()).map(|i| format!("${i}")).collect();
        format!(
            "INSERT INTO {} ({}) VALUES ({})",
            Self::TABLE,
            Self::COLUMNS.join(", "),
            marks.join(", ")
        )
    }
}

/// A field as a parameter. Unlike `Value::from`, a number the database's
/// signed 64-bit integer cannot hold is refused ([`DbError::OutOfRange`]),
/// never wrapped: a wrapped expiry would read back as long past.
pub trait ToValue {
    fn to_value(&self, column: &'static str) -> Result<Value, DbError>;
}

macro_rules! to_value_by_from {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self, _: &'static str) -> Result<Value, DbError> {
                Ok(Value::from(self.clone()))
            }
        }
    )*};
}
to_value_by_from!(
    String,
    Option<String>,
    bool,
    i32,
    i64,
    u8,
    u16,
    u32,
    f64,
    Vec<u8>
);

impl ToValue for u64 {
    fn to_value(&self, column: &'static str) -> Result<Value, DbError> {
        i64::try_from(*self)
            .map(Value::Int)
            .map_err(|_| DbError::OutOfRange {
                column,
                value: *self,
            })
    }
}

impl ToValue for Option<u64> {
    fn to_value(&self, column: &'static str) -> Result<Value, DbError> {
        self.map_or(Ok(Value::Null), |v| v.to_value(column))
    }
}

/// A string map (metadata, env) stored as a JSON object: text on SQLite,
/// JSONB (or text) on PostgreSQL.
impl ToValue for BTreeMap<String, String> {
    fn to_value(&self, _: &'static str) -> Result<Value, DbError> {
        Ok(Value::Text(
            serde_json::to_string(self).unwrap_or_else(|_| "{}".into()),
        ))
    }
}

impl FromValue for BTreeMap<String, String> {
    const NAME: &'static str = "a JSON object of strings";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) => serde_json::from_str(s).ok(),
            _ => None,
        }
    }
}

/// Declares a struct whose fields are the columns of `table`, and its
/// [`Record`] implementation:
///
/// ```
/// hatchery_db::record! {
///     #[derive(Debug, Clone, PartialEq)]
///     pub struct Fork in "forks" {
///         pub id: String,
///         pub created_at_ms: u64,
///     }
/// }
/// ```
///
/// Each field's type reads with [`FromValue`](crate::FromValue) and
/// writes with [`ToValue`]; an enum stored by name gets both from
/// [`named!`](crate::named).
///
/// Without `in "table"` the struct is a query's result, not a table's row
/// (a field may be an alias, `id AS approval_id`): it gets an inherent
/// `from_row` and no [`Record`], so no INSERT names a column that is not
/// there.
#[macro_export]
macro_rules! record {
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $($(#[$fm])* $fvis $field: $ty),* }

        impl $name {
            /// The query's row, read by column name.
            $vis fn from_row(r: &$crate::Row) -> Result<Self, $crate::DbError> {
                Ok($name { $($field: r.get(stringify!($field))?),* })
            }
        }
    };
    ($(#[$m:meta])* $vis:vis struct $name:ident in $table:literal {
        $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $($(#[$fm])* $fvis $field: $ty),* }

        impl $crate::Record for $name {
            const TABLE: &'static str = $table;
            const COLUMNS: &'static [&'static str] = &[$(stringify!($field)),*];
            fn values(&self) -> Result<Vec<$crate::Value>, $crate::DbError> {
                Ok(vec![$($crate::ToValue::to_value(&self.$field, stringify!($field))?),*])
            }
            fn from_row(r: &$crate::Row) -> Result<Self, $crate::DbError> {
                Ok($name { $($field: r.get(stringify!($field))?),* })
            }
        }
    };
}

/// A type stored as its name (`self.$name()`), read back with
/// `$ty::$parse`: a stored name that is none of its values is a
/// [`DbError::Type`] naming the column, never some default.
#[macro_export]
macro_rules! named {
    ($ty:ty, $name:ident, $parse:ident) => {
        impl $crate::FromValue for $ty {
            const NAME: &'static str = stringify!($ty);
            fn from_value(v: &$crate::Value) -> Option<Self> {
                match v {
                    $crate::Value::Text(s) => <$ty>::$parse(s),
                    _ => None,
                }
            }
        }
        impl $crate::ToValue for $ty {
            fn to_value(&self, _: &'static str) -> Result<$crate::Value, $crate::DbError> {
                Ok($crate::Value::Text(self.$name().to_string()))
            }
        }
    };
}

/// Declares a fieldless enum stored by its names: `ALL`, `as_str`,
/// `parse` (`None` for any other text, never some default) and its
/// [`named!`](crate::named) storage. The enum must derive `Copy`.
///
/// ```
/// hatchery_db::names! {
///     #[derive(Debug, Clone, Copy, PartialEq)]
///     pub enum Side {
///         Left = "left",
///         Right = "right",
///     }
/// }
/// assert_eq!(Side::parse("right"), Some(Side::Right));
/// assert_eq!(Side::ALL.len(), 2);
/// ```
#[macro_export]
macro_rules! names {
    ($(#[$m:meta])* $vis:vis enum $name:ident {
        $($(#[$vm:meta])* $v:ident = $s:literal),* $(,)?
    }) => {
        $(#[$m])*
        $vis enum $name { $($(#[$vm])* $v),* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => $s),* }
            }
            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|x| x.as_str() == s)
            }
        }
        $crate::named!($name, as_str, parse);
    };
}

/// A type stored as its JSON text (a spec), read back with serde; `$what`
/// names it in errors: a stored value that does not decode is a
/// [`DbError::Type`] naming the column. For plain data (strings, numbers,
/// maps of them), which always serializes.
#[macro_export]
macro_rules! json {
    ($ty:ty, $what:literal) => {
        impl $crate::FromValue for $ty {
            const NAME: &'static str = $what;
            fn from_value(v: &$crate::Value) -> Option<Self> {
                match v {
                    $crate::Value::Text(s) => $crate::serde_json::from_str(s).ok(),
                    _ => None,
                }
            }
        }
        impl $crate::ToValue for $ty {
            fn to_value(&self, _: &'static str) -> Result<$crate::Value, $crate::DbError> {
                let json = $crate::serde_json::to_string(self).unwrap_or_default();
                Ok($crate::Value::Text(json))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Db;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Color {
        Red,
        Blue,
    }
    impl Color {
        fn as_str(self) -> &'static str {
            match self {
                Color::Red => "red",
                Color::Blue => "blue",
            }
        }
        fn parse(s: &str) -> Option<Color> {
            [Color::Red, Color::Blue]
                .into_iter()
                .find(|c| c.as_str() == s)
        }
    }
    named!(Color, as_str, parse);

    record! {
        #[derive(Debug, Clone, PartialEq)]
        struct Thing in "things" {
            id: String,
            color: Color,
            note: Option<String>,
            at_ms: u64,
        }
    }

    record! {
        /// A query's result: `from_row`, no `Record`.
        struct Renamed {
            thing: String,
            at_ms: u64,
        }
    }

    #[tokio::test]
    async fn records_round_trip_and_refuse_what_does_not_fit() {
        let db = Db::sqlite_memory().unwrap();
        let mut tx = db.begin().await.unwrap();
        tx.batch("CREATE TABLE things (seq INTEGER PRIMARY KEY, id TEXT, color TEXT, note TEXT, at_ms BIGINT)")
            .await
            .unwrap();
        let t = Thing {
            id: "a".into(),
            color: Color::Blue,
            note: None,
            at_ms: i64::MAX as u64,
        };
        assert_eq!(
            Thing::insert_sql(),
            "INSERT INTO things (id, color, note, at_ms) VALUES ($1, $2, $3, $4)"
        );
        tx.insert(&t).await.unwrap();
        let big = Thing {
            at_ms: i64::MAX as u64 + 1,
            ..t.clone()
        };
        let e = tx.insert(&big).await.unwrap_err();
        assert!(
            matches!(
                e,
                DbError::OutOfRange {
                    column: "at_ms",
                    ..
                }
            ),
            "{e}"
        );
        tx.execute(
            "INSERT INTO things (id, color, at_ms) VALUES ('b', 'green', 1)",
            &[],
        )
        .await
        .unwrap();
        let rows = tx
            .query("SELECT * FROM things ORDER BY seq", &[])
            .await
            .unwrap();
        assert_eq!(Thing::from_row(&rows[0]).unwrap(), t);
        let sql = "SELECT id AS thing, at_ms FROM things ORDER BY seq";
        let r = Renamed::from_row(&tx.query(sql, &[]).await.unwrap()[0]).unwrap();
        assert_eq!((&*r.thing, r.at_ms), ("a", t.at_ms));
        let e = Thing::from_row(&rows[1]).unwrap_err();
        assert!(e.to_string().contains("color"), "{e}");
    }
}
