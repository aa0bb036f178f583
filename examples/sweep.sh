#!/bin/sh
# A parameter sweep that works for SECONDS (default 20): it says how many tasks it got, and where.
# Submit it with as many tasks as fit, 1 to 4:  xce submit -J sweep -n 1,4 -- ./sweep.sh 20
echo "sweep: job ${XCE_JOBID} has ${XCE_SLOTS} task(s) on ${XCE_HOSTS}"
sleep "${1:-20}"
echo "sweep: done"
