//! Delta xDS client (being written).
