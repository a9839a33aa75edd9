// The Python module gradsync._c10d: the process group's class, for
// torch.distributed.Backend.register_backend (python/gradsync/__init__.py).
#include "process_group.hpp"

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "gradsync's torch.distributed backend";
  py::object pg = py::module::import("torch.distributed").attr("ProcessGroup");
  py::class_<gradsync::ProcessGroupGradsync, c10d::ProcessGroup, c10::intrusive_ptr<gradsync::ProcessGroupGradsync>>(
      m, "ProcessGroupGradsync")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<gradsync::ProcessGroupGradsync>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>());
  (void)pg;
}
