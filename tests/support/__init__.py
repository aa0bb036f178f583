"""What the tests share: the cluster under test, waiting, the host contract, the test-host fixture."""
