# Runs po-schedule as a user would and checks exit codes and outputs.
# Invoked by CTest: cmake -DPO_SCHEDULE=<binary> -DSOURCE_DIR=<repo> -P po_schedule_cli_test.cmake
cmake_minimum_required(VERSION 3.25)
set(work "${CMAKE_CURRENT_BINARY_DIR}/po_schedule_cli_work")
file(REMOVE_RECURSE "${work}")
file(MAKE_DIRECTORY "${work}")

# run(<expected exit code> <output var> args...): runs po-schedule, fails on another exit code.
function(run expected out_var)
  execute_process(COMMAND "${PO_SCHEDULE}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 120)
  if(NOT rc EQUAL expected)
    message(FATAL_ERROR "po-schedule ${ARGN}: exit ${rc}, expected ${expected}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

function(expect_contains text needle what)
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what}: expected to find \"${needle}\" in:\n${text}")
  endif()
endfunction()

# Help lists every option.
run(0 help --help)
foreach(option stages microbatches chunks group-size split-backward unsplit-backward policy family
        placement
        offload-fraction
        offload-chunks memory-budget strict unit-costs offload-ratio cost-model format out
        recompute recompute-fraction recompute-chunks)
  expect_contains("${help}" "--${option}" "--help")
endforeach()
expect_contains("${help}" "| svg (a picture" "--help names the svg format")

# Bad input: clear errors, exit code 2, never a crash.
run(2 err --stages 0)
expect_contains("${err}" "--stages: expected an integer >= 1" "--stages 0")
run(2 err --stages x)
run(2 err --policy nope)
expect_contains("${err}" "--policy" "--policy nope")
run(2 err --bogus)
expect_contains("${err}" "unknown option --bogus" "--bogus")
run(2 err --policy interleaved --stages 4 --microbatches 6 --chunks 2)
expect_contains("${err}" "num_microbatches" "interleaved m % p")
run(2 err --policy 1f1b --chunks 2)
run(2 err --policy group-interleaved --stages 8 --group-size 2)
run(2 err --cost-model "${work}/missing.json")
run(2 err validate "${work}/missing.json")
file(WRITE "${work}/broken.json" "{\"format\": \"pipeoffload.schedule/1\", \"stages\": [")
run(2 err validate "${work}/broken.json")

# One schedule in every format.
run(0 table --stages 4 --microbatches 8 --unit-costs)
expect_contains("${table}" "1f1b p=4 m=8" "table header")
run(0 text --stages 4 --microbatches 8 --format text)
expect_contains("${text}" "F0.0" "text form")
run(0 csv --stages 4 --microbatches 8 --format pytorch-csv)
expect_contains("${csv}" "0F0" "pytorch csv")
expect_contains("${csv}" "3B7" "pytorch csv")

# JSON written to a file validates and reproduces the same predictions.
run(0 ignored --stages 4 --microbatches 8 --policy po-f --unit-costs --format json
    --out "${work}/po-f.json")
run(0 checked validate "${work}/po-f.json" --unit-costs)
expect_contains("${checked}" "valid schedule" "validate")

# PyTorch CSV round trip through import.
run(0 ignored --stages 4 --microbatches 8 --format pytorch-csv --out "${work}/1f1b.csv")
run(0 imported import "${work}/1f1b.csv" --stages 4 --unit-costs)
expect_contains("${imported}" "p=4 m=8" "import")
# A V schedule (torch's ZBVZeroBubble) round trips with neither --stages nor --placement: both
# come from the file; a given --stages must agree with its rows.
run(0 ignored --policy zbv --stages 3 --microbatches 6 --format pytorch-csv
    --out "${work}/zbv.csv")
run(0 zbv_text import "${work}/zbv.csv" --unit-costs --format json)
expect_contains("${zbv_text}" "\"stages\": 3" "import zbv")
expect_contains("${zbv_text}" "\"placement\": \"v\"" "import zbv")
run(0 ignored import "${work}/zbv.csv" --stages 3 --placement v --unit-costs)
run(2 wrong_stages import "${work}/zbv.csv" --stages 4 --unit-costs)
expect_contains("${wrong_stages}" "the CSV has 3 rows but the pipeline has num_stages = 4" "import")
run(2 wrong_placement import "${work}/zbv.csv" --placement loop --unit-costs)
expect_contains("${wrong_placement}" "under loop placement" "import --placement loop")
run(2 contradiction --policy zbv --placement loop --stages 2 --microbatches 4)
expect_contains("${contradiction}" "--placement loop contradicts --policy zbv" "compile")

# A trace opens as JSON with trace events.
run(0 ignored --stages 4 --microbatches 8 --chunks 2 --policy po-f --unit-costs --format trace
    --out "${work}/trace.json")
file(READ "${work}/trace.json" trace)
string(JSON events LENGTH "${trace}" traceEvents)
if(events LESS 10)
  message(FATAL_ERROR "trace has only ${events} events")
endif()

# An SVG picture: stdout and --out give the golden file byte for byte (schedule_tests writes
# and checks it too), it parses as XML where python3 is found, validate and import draw it too.
set(golden_svg "${SOURCE_DIR}/tests/golden/1f1b_p2_m4_po-h.svg")
file(READ "${golden_svg}" golden)
set(svg_args --stages 2 --microbatches 4 --policy po-h --unit-costs --format svg)
run(0 svg ${svg_args})
if(NOT svg STREQUAL golden)
  string(JOIN " " shown ${svg_args})
  message(FATAL_ERROR "po-schedule ${shown} differs from ${golden_svg}")
endif()
run(0 wrote ${svg_args} --out "${work}/p2.svg")
expect_contains("${wrote}" "wrote ${work}/p2.svg" "--format svg --out")
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${work}/p2.svg" "${golden_svg}"
                RESULT_VARIABLE differs)
if(differs)
  message(FATAL_ERROR "--format svg --out ${work}/p2.svg differs from ${golden_svg}")
endif()
run(0 ignored --stages 4 --microbatches 8 --chunks 2 --policy po-f --format svg
    --out "${work}/gi.svg")
find_program(PYTHON3 python3)
if(PYTHON3)
  foreach(picture p2 gi)
    execute_process(COMMAND "${PYTHON3}" -c
                    "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])"
                    "${work}/${picture}.svg" RESULT_VARIABLE bad_xml ERROR_VARIABLE why)
    if(bad_xml)
      message(FATAL_ERROR "${work}/${picture}.svg is not well-formed XML:\n${why}")
    endif()
  endforeach()
endif()
run(0 checked_svg validate "${work}/po-f.json" --unit-costs --format svg)
expect_contains("${checked_svg}" "<g id=\"stage-3\">" "validate --format svg")
run(0 imported_svg import "${work}/1f1b.csv" --stages 4 --unit-costs --format svg)
expect_contains("${imported_svg}" "<rect class=\"F\"" "import --format svg")
# Bad combinations: a clear error and exit code 2 (or 1 for an unwritable file), never a crash.
run(2 err --format SVG)
expect_contains("${err}" "trace or svg" "--format SVG")
run(2 err --format)
expect_contains("${err}" "--format needs a value" "--format without a value")
run(2 err compare --stages 4 --microbatches 8 --format svg)
expect_contains("${err}" "compare prints a table only; --format svg" "compare --format svg")
run(1 err ${svg_args} --out "${work}/no/such/dir/p2.svg")
expect_contains("${err}" "cannot write" "--out into a missing folder")

# Bandwidth-limited offload: a plan with a warning that names the shortfall, or with --strict an
# error (exit 2) that says so; never a crash.
run(0 limited --stages 8 --microbatches 32 --policy po-f --unit-costs --offload-ratio 1)
expect_contains("${limited}" "overhead +0.00%" "po-f table overhead")
expect_contains("${limited}" "warning: offload po-f: the host links carry less than requested"
                "shortfall warning")
run(2 strict --stages 8 --microbatches 32 --policy po-f --unit-costs --offload-ratio 1 --strict)
expect_contains("${strict}" "strict offload:" "--strict error")
run(0 fits --stages 8 --microbatches 32 --policy po-f --unit-costs --offload-ratio 0.25 --strict)
expect_contains("${fits}" "offload=po-f" "--strict when the links carry the plan")

# compare shows every policy.
run(0 compare compare --stages 4 --microbatches 16 --unit-costs --offload-ratio 0.25)
foreach(policy "1f1b" "interleaved" "group-interleaved" "po-h" "po-f" "selective" "auto"
       "recompute full (1f1b)" "recompute lean (1f1b)" "recompute lean + po-f (1f1b)")
  expect_contains("${compare}" "${policy}" "compare")
endforeach()
# compare's defaults (p=8, m=32, GPT costs) split the backward in every row, say so and why, and
# then no row of the paper's schedule is slower than 1f1b; 1f1b itself is the split one, so
# "vs 1f1b" weighs orders, not backward modes.
# vs_1f1b(<table> <row label> <out var>): the row's "vs 1f1b" cell (the first signed percentage).
function(vs_1f1b table label out_var)
  string(REGEX MATCH "\n${label}  [^\n]*" line "\n${table}")
  string(REGEX MATCH " [+-][0-9]+\\.[0-9]%" cell "${line}")
  if(cell STREQUAL "")
    message(FATAL_ERROR "compare: no \"vs 1f1b\" cell in the row \"${label}\" of:\n${table}")
  endif()
  string(STRIP "${cell}" cell)
  set(${out_var} "${cell}" PARENT_SCOPE)
endfunction()
# expect_same_1f1b(<compare table> <compile table> <what>): compare's 1f1b row shows the step
# of that one 1f1b schedule, at +0.0%.
function(expect_same_1f1b table single what)
  string(REGEX MATCH "step [0-9]+\\.[0-9] ms" step "${single}")
  string(REPLACE "step " "" step "${step}")
  string(REPLACE "." "\\." step "${step}")
  if(step STREQUAL "" OR NOT "\n${table}" MATCHES "\n1f1b +1 +- +${step} +\\+0\\.0%")
    message(FATAL_ERROR "${what}: no 1f1b row at \"${step}\" in:\n${table}\n${single}")
  endif()
endfunction()
run(0 first compare)
expect_contains("${first}" "pipeline: p=8 m=32 split-backward\n" "default compare header")
expect_contains("${first}"
                "backward split (B, then W) in every row: compare's default; --unsplit-backward"
                "default compare note")
expect_contains("${first}" "why: group-interleaved's building blocks assume split passes"
                "default compare note")
foreach(label "group-interleaved" "po-h \\(group-interleaved\\)"
        "po-f \\(group-interleaved\\)" "selective 25%" "auto \\(budget: half the 1f1b peak\\)")
  vs_1f1b("${first}" "${label}" cell)
  if(NOT cell MATCHES "^-")
    message(FATAL_ERROR "default compare: ${label} is ${cell} against 1f1b:\n${first}")
  endif()
endforeach()
run(0 split_1f1b --split-backward)
expect_same_1f1b("${first}" "${split_1f1b}" "default compare's 1f1b is the split 1f1b")
# --unsplit-backward: W inside B except where the family splits by definition; the table says so.
run(0 unsplit compare --unsplit-backward)
expect_contains("${unsplit}" "pipeline: p=8 m=32\nbackward unsplit (W inside B, --unsplit-backward)"
                "unsplit compare header")
expect_contains("${unsplit}"
                "except zbv, dualpipev (split by definition, weighed against an unsplit 1f1b)"
                "unsplit compare note")
expect_contains("${unsplit}" "compare's default is split: " "unsplit compare note")
run(0 fused_1f1b)
expect_same_1f1b("${unsplit}" "${fused_1f1b}" "unsplit compare's 1f1b is the unsplit 1f1b")
run(2 both compare --split-backward --unsplit-backward)
expect_contains("${both}" "--split-backward and --unsplit-backward contradict each other"
                "both backward flags")
run(2 compile_unsplit --unsplit-backward)
expect_contains("${compile_unsplit}" "--unsplit-backward is read only by compare"
                "--unsplit-backward without compare")
run(2 valued compare --unsplit-backward=1)
expect_contains("${valued}" "--unsplit-backward takes no value" "--unsplit-backward=1")
# Recompute: the ops in the text form, the spec in the JSON, errors for what cannot mix.
run(0 recompute --stages 2 --microbatches 4 --unit-costs --recompute full --format text)
expect_contains("${recompute}" "recompute=full recompute-fraction=1" "--recompute full")
expect_contains("${recompute}" "RECOMPUTE0.0 B0.0" "--recompute full")
run(0 lean --stages 2 --microbatches 4 --unit-costs --recompute lean --recompute-chunks 1
    --format json)
expect_contains("${lean}" "\"recompute\": \"lean\"" "--recompute lean")
expect_contains("${lean}" "\"op\": \"RECOMPUTE_LEAN\"" "--recompute lean")
run(0 mixed --stages 4 --microbatches 8 --policy po-f --recompute lean --unit-costs --format text)
expect_contains("${mixed}" "RECOMPUTE_LEAN" "--recompute lean with --policy po-f")
expect_contains("${mixed}" "OFFLOAD" "--recompute lean with --policy po-f")
run(2 unused --stages 2 --microbatches 4 --recompute-fraction 0.5)
expect_contains("${unused}" "--recompute-fraction is read only by --recompute lean or full"
                "--recompute-fraction alone")
run(2 bad --recompute some)
expect_contains("${bad}" "--recompute" "--recompute some")
message(STATUS "po-schedule CLI: all checks passed")
