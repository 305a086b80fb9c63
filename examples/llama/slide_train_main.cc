// slide_train: layer-sliding fine-tuning of a Llama-architecture model (slide_train --help).
#include <iostream>
#include <string>
#include <vector>

#include "examples/llama/slide_options.h"
#include "examples/llama/slide_train.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const auto options = pipeoffload::llama::ParseSlideTrainOptions(args);
  if (!options.ok()) {
    std::cerr << "slide_train: " << options.status().message() << "\n";
    return 2;
  }
  if (options->help) {
    std::cout << pipeoffload::llama::SlideTrainHelpText();
    return 0;
  }
  const auto summary = pipeoffload::llama::RunSlideTrain(*options, std::cout);
  if (!summary.ok()) {
    std::cerr << "slide_train: " << summary.status().message() << "\n";
    return 1;
  }
  return 0;
}
