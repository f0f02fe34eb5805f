//! The discovery walk: the singleton service's side. Every round it learns what each member serves
//! ([`sync`]: membership, fetches, answers, the legacy walk, the build), from the documents of
//! [`documents`] (and, in lease mode, the members from [`leases`] or [`endpoints`]), and publishes
//! the snapshot ([`crate::snapshot`]) with the merged discovery documents ([`merge`]).

pub mod documents;
pub mod endpoints;
pub mod interned;
pub mod leases;
pub mod merge;
pub mod openapi_index;
pub mod sync;
