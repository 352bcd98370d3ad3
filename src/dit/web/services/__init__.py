"""What NNPM's routers (:mod:`dit.web.routes`) call: the node inventory, scenario versions, runs, runtimes,
probes, terminals, topology, floor plans and plots, each testable without HTTP."""
