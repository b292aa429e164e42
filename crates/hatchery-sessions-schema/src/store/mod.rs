//! The sessions' tables (`schema`) and the audit reader's queries on them
//! (`audit`), the same SQL on SQLite and PostgreSQL.

pub mod audit;
pub mod schema;
