# SPDX-FileCopyrightText: Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
# SPDX-License-Identifier: Apache-2.0
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
# http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

import os
import resource
import warnings


def init_script(verbose: bool = False):
    """Initialize inference script."""
    # Suppress core dumps
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    # Tokenizers parallelism doesn't work with vllm
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if not verbose:
        warnings.filterwarnings("ignore")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
