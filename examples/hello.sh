#!/bin/sh
# A first batch job: say where and as what it runs.
# Submit it with: xce submit -J hello -o hello-%J.out -- sh examples/hello.sh
# With its application profile (examples/applications.yaml): xce submit -app hello -- sh examples/hello.sh
echo "hello from job ${XCE_JOBID} (${XCE_JOB_NAME}) in queue ${XCE_QUEUE} on $(hostname)"
echo "working directory: $(pwd)"
if [ -n "${XCE_APP:-}" ]; then
  echo "application ${XCE_APP}: ${GREETING:-hi} in style ${XCE_APP_PARAM_STYLE:-none}, owner ${XCE_APP_ANN_EXAMPLE_OWNER:-none}"
fi
