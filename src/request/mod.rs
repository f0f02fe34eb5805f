//! The request walk: what the HTTP filter does with one client request, as plain decisions the
//! adapter (`src/wasm/filter.rs`) carries out. In order: [`identity`] (the client certificate's
//! identity asserted, client copies stripped), [`readiness`] (a health check before the first
//! snapshot), [`request_info`] and [`accept`] (the path and `Accept` parsed), [`routing`] (where the
//! request goes) and [`forward`] (the headers that send it there), then in the response phase [`response`] (a merged discovery answer's headers),
//! [`guard`] with [`not_found`] (whether a 404 might be false) and [`reply`] (the replies the filter
//! makes itself).

pub mod accept;
pub mod forward;
pub mod guard;
pub mod identity;
pub mod not_found;
pub mod readiness;
pub mod reply;
pub mod request_info;
pub mod response;
pub mod routing;
