"""On-demand benchmarks of a local Quire cluster, side by side with Apache ZooKeeper.

Two parts: the Zab layer (Quire driven by its own trio client, MetaClient;
ZooKeeper by kazoo) and the metastore (kazoo over the ZooKeeper client
protocol, against both systems).

Run with `python -m bench.run [--quick]` (or `bash bench/run.sh`); results go to
docs/benchmarks.md. Nothing here is part of the test suite: tests/ never imports it.

Modules:
    run        the command line: runs the suite, writes the report (run.sh installs prerequisites first)
    suite      which benchmarks run, in which order and sizes; the Results object
    machine    facts about this machine; CPU accounting of processes
    stats      percentiles and summaries
    quire      a throw-away Quire cluster (own cluster.toml, free ports, temp data dirs)
    zk         a throw-away ZooKeeper ensemble from Debian's jars
    workload   write workloads: Quire (trio, the project's MetaClient) and ZooKeeper (kazoo), znode setData
    election   leader-failover timing for both systems
    disk       the disk's own fsync rate
    throughput throughput, commit latency and log fsync counters of one workload on a fresh cluster
    profile    py-spy sampling of the Quire leader, folded into top functions
    timeline   Quire failovers reconstructed from the node logs
    logscan    warnings and errors from every server log, grouped
    kzbench    the metastore part: one kazoo workload against ZooKeeper and Quire's ZooKeeper protocol
    kzworker   one kazoo client process of that part (several run at once)
    report     the markdown of docs/benchmarks.md
    zab_report its Zab-layer sections (summary, sections 1 to 4)
"""
