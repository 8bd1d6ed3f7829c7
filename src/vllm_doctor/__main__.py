from vllm_doctor.cli.complete import main

main()
