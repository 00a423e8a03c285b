//! Placement: which nodes hold a volume's replicas, and which of them is
//! primary.
//!
//! Pure: nodes and their load in, a choice out. Rules, in priority order:
//! 1. replicas go to distinct nodes that are alive and accept replicas;
//! 2. they spread over as many distinct zones as possible (a zone holds a
//!    second replica only when every zone already holds one);
//! 3. among equals, the node with the most free capacity wins, ties broken
//!    by fewer primaries, then by node id (deterministic);
//! 4. the primary is the chosen node with the fewest primaries.
//!
//! Fewer eligible nodes than replicas is not an error: the volume is placed
//! degraded on what there is and the caller records how many are missing.
