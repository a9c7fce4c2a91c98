//! LRS server (being written).
