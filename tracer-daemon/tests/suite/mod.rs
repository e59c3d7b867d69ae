//! One module per area of the root integration tests, and their shared
//! `support`.

mod api;
mod capacity;
mod capture;
mod cli;
mod faults;
mod metrics;
mod persistence;
mod quota;
mod service;
mod services;
mod support;
mod unwind;
mod watch;
