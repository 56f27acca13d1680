"""dtrain-report: turns the per-rank profiles dtrain writes (DTRAIN_PROFILE) into one HTML report
with charts and rule findings. Python 3 standard library only, so it runs wherever the training
ran, without a network or packages to install.

Modules, in the order data flows through them:
  run_files       finds the files and chooses the run when a folder holds several (Note
                  [Profile layout] in include/dtrain/profile/run_folder.hpp)
  profile_reader  reads and validates the JSON Lines files (the schema: Note [Profile schema]
                  in include/dtrain/profile/records.hpp) and says what it skipped
  analysis        per-rank and per-step figures the rules and charts share
  thresholds      the rules' configurable thresholds
  rules           the findings: each rule's verdict, evidence and suggestion
  svg, charts     inline SVG charts
  html_report     the self-contained page
  cli             the command line
"""

SUPPORTED_FORMAT_VERSION = 1
