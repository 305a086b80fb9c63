// LaunchedByMpi: what every gpt_train build can tell without MPI.
#include <cstdlib>

#include "examples/gpt/train_group.h"

namespace pipeoffload::gpt {

bool LaunchedByMpi() {
  // Open MPI, MPICH / Intel MPI (PMI), PMIx launchers and MVAPICH2 set these in every rank.
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

}  // namespace pipeoffload::gpt
