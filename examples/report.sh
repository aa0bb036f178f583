#!/bin/sh
# What a job that waits for another does once it may run: here, read the sweep's output.
# Submit it after the sweep:  xce submit -J report -w "done(sweep)" -- ./report.sh
echo "report: job ${XCE_JOBID} ran after the sweep"
cat xce-*.out 2>/dev/null | grep '^sweep:' || echo "report: no sweep output here"
