"""What the tests share, once: test modules import helpers from here only (tests/project/
test_test_layout.py keeps it so). The cluster under test (cluster, remote, trust), waiting, the
host contract and the test-host fixture, the agent seen from outside and inside test hosts
(agent_local, agent_hosts), builders (store, sched, configs), the placement reference, store faults,
/proc readers (procs), and the fixtures several modules use (fixtures, registered by conftest)."""
