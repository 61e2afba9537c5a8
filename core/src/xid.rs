//! NVIDIA Xid kernel-log lines and the default Xid policy. (Being written.)
