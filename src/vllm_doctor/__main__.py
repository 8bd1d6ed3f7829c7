from vllm_doctor.cli import main

main()
