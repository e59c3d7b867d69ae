//! The route handlers, one file per family: each parses its path and
//! query (400 naming what is valid), calls the service off the async
//! threads, and renders the answer.
pub mod control;
pub mod metrics;
pub mod openapi;
pub mod scope;
pub mod snapshots;
pub mod status;
pub mod ui;
pub mod views;
