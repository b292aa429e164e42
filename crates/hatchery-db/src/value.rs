//! What crosses the seam between a product's queries and either driver:
//! parameters as [`Value`]s and result rows as [`Row`]s of them. The same
//! five types exist in both databases (integer, real, text, bytes,
//! boolean), so one query binds and reads the same Rust values on both.
//! PostgreSQL's column types are stricter than SQLite's; the conversion
//! here follows the column (an integer parameter into an `INT4` column is
//! sent as one, checked), so a product never writes `as i32` for one
//! backend only.

use crate::error::DbError;
use bytes::BytesMut;
use std::sync::Arc;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// A parameter or a column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Bytes(Vec<u8>),
    Bool(bool),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Int(_) => "an integer",
            Value::Real(_) => "a real",
            Value::Text(_) => "text",
            Value::Bytes(_) => "bytes",
            Value::Bool(_) => "a boolean",
        }
    }
}

/// Parameters for one statement: `args![id, version, doc]`.
#[macro_export]
macro_rules! args {
    () => { &[] as &[$crate::Value] };
    ($($v:expr),+ $(,)?) => { &[$($crate::Value::from($v)),+] as &[$crate::Value] };
}

/// The `parts` that have a value (the SET list of a partial update, a
/// list's optional filters): each value is pushed onto `args`, and its
/// part's `$v` becomes that parameter's number.
pub fn bind<'a>(
    args: &mut Vec<Value>,
    parts: impl IntoIterator<Item = (&'a str, Option<Value>)>,
) -> Vec<String> {
    let mut out = vec![];
    for (part, v) in parts {
        if let Some(v) = v {
            args.push(v);
            out.push(part.replace("$v", &format!("${}", args.len())));
        }
    }
    out
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::Int(v as i64)
            }
        }
    )*};
}
// u64 and usize above i64::MAX do not occur in this codebase's counters
// (sizes, milliseconds, versions); the cast keeps the bits.
from_int!(i8, i16, i32, i64, u8, u16, u32, u64, usize);

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Real(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v)
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Bytes(v.to_vec())
    }
}
impl From<&Vec<u8>> for Value {
    fn from(v: &Vec<u8>) -> Self {
        Value::Bytes(v.clone())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}
impl From<&Value> for Value {
    fn from(v: &Value) -> Self {
        v.clone()
    }
}

/// A Rust type a column converts to.
pub trait FromValue: Sized {
    const NAME: &'static str;
    /// `None` when the value's type does not fit.
    fn from_value(v: &Value) -> Option<Self>;
}

macro_rules! to_int {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            const NAME: &'static str = stringify!($t);
            fn from_value(v: &Value) -> Option<Self> {
                match v {
                    Value::Int(i) => <$t>::try_from(*i).ok(),
                    Value::Bool(b) => Some(*b as $t),
                    _ => None,
                }
            }
        }
    )*};
}
to_int!(i16, i32, i64, u8, u16, u32, u64, usize);

impl FromValue for bool {
    const NAME: &'static str = "bool";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
}
impl FromValue for f64 {
    const NAME: &'static str = "f64";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Real(r) => Some(*r),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}
impl FromValue for String {
    const NAME: &'static str = "text";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}
impl FromValue for Vec<u8> {
    const NAME: &'static str = "bytes";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Bytes(b) => Some(b.clone()),
            Value::Text(s) => Some(s.as_bytes().to_vec()),
            _ => None,
        }
    }
}
impl<T: FromValue> FromValue for Option<T> {
    const NAME: &'static str = T::NAME;
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Null => Some(None),
            other => T::from_value(other).map(Some),
        }
    }
}
impl FromValue for Value {
    const NAME: &'static str = "value";
    fn from_value(v: &Value) -> Option<Self> {
        Some(v.clone())
    }
}

/// One result row: its columns' names (shared by every row of a result)
/// and values.
#[derive(Debug, Clone)]
pub struct Row {
    pub(crate) names: Arc<[String]>,
    pub(crate) values: Vec<Value>,
}

/// A column by position or by name.
pub trait ColumnIndex {
    fn position(&self, names: &[String]) -> Option<usize>;
    fn label(&self) -> String;
}
impl ColumnIndex for usize {
    fn position(&self, names: &[String]) -> Option<usize> {
        (*self < names.len()).then_some(*self)
    }
    fn label(&self) -> String {
        format!("#{self}")
    }
}
impl ColumnIndex for &str {
    fn position(&self, names: &[String]) -> Option<usize> {
        names.iter().position(|n| n == self)
    }
    fn label(&self) -> String {
        (*self).to_owned()
    }
}

impl Row {
    /// The column converted to `T`; a clear error (never a panic) for a
    /// missing column or a value of another type.
    pub fn get<T: FromValue>(&self, col: impl ColumnIndex) -> Result<T, DbError> {
        let i = col
            .position(&self.names)
            .ok_or_else(|| DbError::NoColumn(col.label()))?;
        let v = &self.values[i];
        T::from_value(v).ok_or_else(|| DbError::Type {
            column: self.names[i].clone(),
            wanted: T::NAME,
            found: v.kind(),
        })
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

// ---- PostgreSQL: a Value is sent as the type of the column it meets ----

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                _ => Err(mismatch("an integer", ty)),
            },
            Value::Real(r) => match *ty {
                Type::FLOAT8 => r.to_sql(ty, out),
                Type::FLOAT4 => (*r as f32).to_sql(ty, out),
                _ => Err(mismatch("a real", ty)),
            },
            Value::Bool(b) => match *ty {
                Type::BOOL => b.to_sql(ty, out),
                Type::INT8 | Type::INT4 | Type::INT2 => Value::Int(*b as i64).to_sql(ty, out),
                _ => Err(mismatch("a boolean", ty)),
            },
            Value::Text(s) => match *ty {
                Type::JSONB => {
                    // jsonb's binary form: a version byte, then the text.
                    out.extend_from_slice(&[1]);
                    out.extend_from_slice(s.as_bytes());
                    Ok(IsNull::No)
                }
                Type::BYTEA => s.as_bytes().to_sql(ty, out),
                _ => s.to_sql(ty, out),
            },
            Value::Bytes(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in to_sql, against the column's actual type.
        true
    }

    to_sql_checked!();
}

fn mismatch(what: &str, ty: &Type) -> Box<dyn std::error::Error + Sync + Send> {
    format!("{what} cannot be sent as {ty}").into()
}

pub(crate) fn pg_row(row: &tokio_postgres::Row, names: &Arc<[String]>) -> Result<Row, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, col) in row.columns().iter().enumerate() {
        let ty = col.type_();
        let v = match *ty {
            Type::INT8 => row.try_get::<_, Option<i64>>(i)?.map(Value::Int),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::INT2 => row
                .try_get::<_, Option<i16>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::FLOAT8 => row.try_get::<_, Option<f64>>(i)?.map(Value::Real),
            Type::FLOAT4 => row
                .try_get::<_, Option<f32>>(i)?
                .map(|v| Value::Real(v.into())),
            Type::BOOL => row.try_get::<_, Option<bool>>(i)?.map(Value::Bool),
            Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Bytes),
            Type::JSON | Type::JSONB => row
                .try_get::<_, Option<JsonText>>(i)?
                .map(|j| Value::Text(j.0)),
            _ => row.try_get::<_, Option<String>>(i)?.map(Value::Text),
        };
        values.push(v.unwrap_or(Value::Null));
    }
    Ok(Row {
        names: names.clone(),
        values,
    })
}

/// A json or jsonb column read as its text.
struct JsonText(String);

impl<'a> tokio_postgres::types::FromSql<'a> for JsonText {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let raw = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, rest)) => rest,
                _ => return Err("unknown jsonb version".into()),
            }
        } else {
            raw
        };
        Ok(JsonText(std::str::from_utf8(raw)?.to_owned()))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::JSON | Type::JSONB)
    }
}

// ---- SQLite ----

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(r) => ValueRef::Real(*r),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Bytes(b) => ValueRef::Blob(b),
            Value::Bool(b) => ValueRef::Integer(*b as i64),
        }))
    }
}

pub(crate) fn sqlite_value(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_numbers_the_parts_that_have_a_value() {
        let mut args = vec![Value::from("id")];
        let parts = [
            ("a = $v", Some(Value::from(1))),
            ("b = $v", None),
            ("c = c + $v OR $v", Some(Value::from(2))),
        ];
        let sets = bind(&mut args, parts);
        assert_eq!(sets, ["a = $2", "c = c + $3 OR $3"]);
        assert_eq!(args, [Value::from("id"), Value::from(1), Value::from(2)]);
    }

    fn row(vals: Vec<Value>) -> Row {
        let names: Arc<[String]> = (0..vals.len()).map(|i| format!("c{i}")).collect();
        Row {
            names,
            values: vals,
        }
    }

    #[test]
    fn columns_convert_or_say_why_not() {
        let r = row(vec![
            Value::Int(7),
            Value::Null,
            Value::Text("x".into()),
            Value::Int(-1),
        ]);
        assert_eq!(r.get::<i64>(0).unwrap(), 7);
        assert_eq!(r.get::<u32>("c0").unwrap(), 7);
        assert!(r.get::<bool>(0).unwrap());
        assert_eq!(r.get::<Option<String>>(1).unwrap(), None);
        assert!(matches!(r.get::<String>(1), Err(DbError::Type { .. })));
        assert_eq!(r.get::<String>("c2").unwrap(), "x");
        assert!(matches!(r.get::<u64>(3), Err(DbError::Type { .. })));
        assert!(matches!(r.get::<i64>("nope"), Err(DbError::NoColumn(_))));
        assert!(matches!(r.get::<i64>(9), Err(DbError::NoColumn(_))));
    }

    #[test]
    fn args_take_every_usual_type() {
        let a = args![1u32, "a", String::from("b"), None::<i64>, Some(true), 2.5];
        assert_eq!(a[0], Value::Int(1));
        assert_eq!(a[3], Value::Null);
        assert_eq!(a[4], Value::Bool(true));
        assert!(args![].is_empty());
    }
}
