//! Owner leases with generation fencing (seed 003).
