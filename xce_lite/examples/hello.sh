#!/bin/sh
# A first batch job: say where and as what it runs.
# Submit it with: xce submit -J hello -o hello-%J.out -- sh examples/hello.sh
echo "hello from job ${XCE_JOBID} (${XCE_JOB_NAME}) in queue ${XCE_QUEUE} on $(hostname)"
echo "working directory: $(pwd)"
